"""Getting each task's data in place: ``python -m simpletron_jax.data where|prepare|verify``.

Nothing here downloads. Each task starts from what the user already has, or has fetched from
the public address its record names (:attr:`simpletron_jax.data.tasks.TaskSpec.download`:
LRA's ``lra_release.gz``, CIFAR-10's python tarball, IMDB's ``aclImdb_v1.tar.gz``, AG News's
``ag_news_csv.tgz``), or from a prepared tfds data dir where the loaders look.

Every function here runs over the task registry: :func:`where`, :func:`prepare` and
:func:`verify` call the ``find``, ``prepare`` and ``check`` of the task's record, so a task
registered with them is in the command with no other change (docs/tasks.md). :func:`where`
reports where a task reads from with the loaders' own search, or one line naming the file to
fetch, its address and the command that puts it in place. :func:`prepare` writes the files
into ``--dest`` (default ``~/data``, where the loaders look without a flag), or generates them
into the cache, with a manifest (:data:`simpletron_jax.data.sources.MANIFEST`: each output's
size and SHA-256, and the source's size and MD5); interrupted, it leaves no folder it began in
the cache. :func:`verify` checks a task's data: the manifest's checksums, the source archive's
MD5 where it is published, and the record's checks (the example counts where they are known,
the label balance where it is known); :func:`configs_to_verify` gives, without ``--config``,
each generated set the cache holds.

Task settings (the ListOps and Pathfinder generator arguments, the data folders) are the
task's record's defaults (:func:`simpletron_jax.data.tasks.task_config`), or those of the
config file ``--config`` names, with ``--config.<field>=<value>`` overrides
(:mod:`simpletron_jax.runtime.overrides`), as for ``train.py``.
"""

from __future__ import annotations

import os
import shutil
from typing import Callable, Sequence

from simpletron_jax.data import sources, tasks
from simpletron_jax.data.sources import COMMAND, MANIFEST, Check, DataError, Where  # noqa: F401
from simpletron_jax.runtime import overrides


def task_config(task: str, spec: str | None = None,
                config_overrides: Sequence[str] = ()) -> tasks.DataConfig:
  """The data settings a command uses (:func:`simpletron_jax.data.tasks.data_config`).

  Args:
    task: a registered task (:func:`simpletron_jax.data.tasks.names`).
    spec: a ``--config`` spec (``configs/<task>/<model>.py:tiny`` for the CPU size, which
      generates less ListOps and Pathfinder data); None: the task record's defaults
      (:func:`simpletron_jax.data.tasks.task_config`, the published size's data).
    config_overrides: ``--config.<field>=<value>`` arguments.

  Returns:
    The task's :class:`simpletron_jax.data.tasks.DataConfig`.

  Raises:
    ValueError: an unknown task (naming ``--task``), a config or override that cannot be
      loaded (one line, :func:`simpletron_jax.runtime.overrides.load_config`), or a bad
      ``data`` field (naming it).
  """
  if task not in tasks.names():
    raise ValueError(f"--task {task!r} is not a task; the tasks: {', '.join(tasks.names())}")
  if spec is None:
    return tasks.data_config(overrides.apply_overrides(tasks.task_config(task),
                                                       config_overrides))
  config = overrides.load_config(spec, config_overrides)
  if config.task != task:
    raise ValueError(f"--config {spec} is a {config.task!r} config, not {task!r}")
  return tasks.data_config(config)


def default_dest() -> str:
  """``~/data`` expanded: where ``prepare`` writes unless ``--dest`` says otherwise."""
  return os.path.expanduser(tasks.DEFAULT_DATA_ROOT)


def where(task: str, data: tasks.DataConfig) -> Where:
  """Where ``task`` reads its data from under its settings ``data``, found by its record's
  ``find``.

  Returns:
    A :class:`Where`; ``kind == "missing"`` with :func:`sources.fetch_line` (or the loader's
    reason, when ``data.data_dir`` or ``data.tfds_data_dir`` names a folder without the data)
    as its note.
  """
  spec = tasks.get(task)
  try:
    return spec.find(data)
  except FileNotFoundError as e:
    if data.folder("data_dir") or data.folder("tfds_data_dir"):
      return Where(task, "missing", "", False, f"{task}: {' '.join(str(e).split())}")
    return Where(task, "missing", "", False, sources.fetch_line(task, spec.download))


def _folders(root: str) -> set[str]:
  """The folders under ``root``, two levels deep (a task's cache, then its sets)."""
  return {*sources.glob_dirs(root, "*"), *sources.glob_dirs(root, os.path.join("*", "*"))}


def _drop_new(root: str, before: set[str]) -> None:
  """Removes the folders under ``root`` that are not in ``before`` (the outermost of each)."""
  removed: list[str] = []
  for path in sorted(_folders(root) - before, key=len):
    if not any(path.startswith(p + os.sep) for p in removed):
      shutil.rmtree(path, ignore_errors=True)
      removed.append(path)


def prepare(task: str, data: tasks.DataConfig, source: str | None = None,
            dest: str | None = None, num_workers: int | None = None,
            log: Callable[[str], None] = print) -> Where:
  """Puts ``task``'s data where the loaders find it, with its record's ``prepare``.

  Generated tasks (``listops``, ``pathfinder``, ``pathx``) without ``source`` generate the
  data the config names into the cache, exactly as training would on first use; with
  ``source`` (``lra_release.gz`` or the folder it was unpacked to) the task's part of LRA's
  release goes into ``{dest}/lra_release/``. ``image``, ``text`` and ``agnews`` make their
  download into the files their reader reads under ``dest`` (docs/data.md). Without
  ``source`` where the task makes nothing, it reports the data the loaders already find.
  Every folder written gets a manifest. Interrupted (``KeyboardInterrupt``), the folders it
  began in the cache are removed before the interrupt goes on.

  Args:
    task: a registered task.
    data: :func:`task_config`.
    source: the downloaded file or unpacked folder (``--from``), or None.
    dest: the destination root (``--dest``); None: ``~/data``.
    num_workers: generator processes (ListOps, Pathfinder); None: every CPU.
    log: progress lines.

  Returns:
    Where the task's data now is.

  Raises:
    DataError: a missing source (one line: what to fetch, from where, what to run), or a
      source that is not what it should be (naming it).
  """
  spec = tasks.get(task)
  dest = os.path.abspath(os.path.expanduser(dest or default_dest()))
  if source is not None:
    source = os.path.abspath(os.path.expanduser(source))
    if not os.path.exists(source):
      d = spec.download
      raise DataError(f"--from {source}: no such file or folder" + (
          f"; fetch {d.file} ({d.what}) from {d.url} and pass its path" if d else ""))
  cache = data.cache
  before = _folders(cache)
  try:
    made = spec.prepare(data, source, dest, num_workers, log)
  except KeyboardInterrupt:
    _drop_new(cache, before)
    raise
  if made is not None:
    return made
  found = where(task, data)
  if found.kind == "missing":
    raise DataError(found.note)
  log(f"{task}: already in place; nothing to do")
  return found


def verify(task: str, data: tasks.DataConfig, source: str | None = None) -> list[Check]:
  """Checks the data ``task`` reads under its settings ``data`` (see the module docstring).

  Args:
    task: a registered task.
    data: :func:`task_config`.
    source: a downloaded file to check against its published MD5 too (``--from``).

  Returns:
    ``(status, line)`` pairs, status ``ok``, ``FAIL`` or ``note``; a missing source is one
    ``FAIL`` with :func:`sources.fetch_line`'s advice.

  Raises:
    ValueError: a malformed data file (``file:line``, from the readers).
  """
  spec = tasks.get(task)
  checks: list[Check] = []
  if source and spec.download:
    checks.append(sources.check_download(spec.download,
                                         os.path.abspath(os.path.expanduser(source))))
  found = where(task, data)
  if found.kind == "missing":
    return checks + [("FAIL", found.note)]
  if not found.ready:
    return checks + [("FAIL", f"{task}: not generated yet in {found.path}; run {COMMAND} "
                              f"prepare --task {task}")]
  checks.append(("note", found.line()))
  folder = found.path if os.path.isdir(found.path) else os.path.dirname(found.path)
  return checks + sources.check_manifest(folder) + spec.check(data, found)


def configs_to_verify(task: str, data: tasks.DataConfig) -> list[tasks.DataConfig]:
  """What ``verify`` without ``--config`` checks: ``data`` (the published size) when its
  data is there or the task generates nothing, else each set generated into the cache (the
  record's ``generated``; ``:tiny`` and any other size), or ``data`` when there is none."""
  spec = tasks.get(task)
  if spec.generated is None or where(task, data).ready:
    return [data]
  return spec.generated(data) or [data]
