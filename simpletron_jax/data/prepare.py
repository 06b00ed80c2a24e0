"""Getting each task's data in place: ``python -m simpletron_jax.data prepare|verify|where``.

Nothing here downloads. Each task starts from what the user already has, or has fetched from
a public address (:data:`DOWNLOADS`):

* LRA's release archive ``lra_release.gz`` (a gzipped tar; in it ``lra_release/listops-1000/``,
  ``lra_release/tsv_data/`` with AAN's ``new_aan_pairs.{train,eval,test}.tsv``,
  ``lra_release/pathfinder32/`` and ``pathfinder128/``), or the folder it was unpacked to:
  ``retrieval``, and optionally ``listops``, ``pathfinder`` and ``pathx`` (which are otherwise
  generated, seeded, by the project);
* CIFAR-10's python tarball ``cifar-10-python.tar.gz`` (or its ``cifar-10-batches-py``
  folder), made into the grayscale ``cifar10_gray_uint8.npz`` the image reader expects
  (:func:`cifar_npz`);
* IMDB's ``aclImdb_v1.tar.gz`` (or its ``aclImdb`` folder), made into
  ``imdb_{train,test}.jsonl.gz`` (:func:`imdb_jsonl`);
* AG News's ``ag_news_csv.tgz`` (or its folder);
* a prepared tfds data dir, found where the loaders look: ``data.tfds_data_dir``, else tfds's
  default (``$TFDS_DATA_DIR``, else ``~/tensorflow_datasets``;
  :func:`simpletron_jax.data.tasks.source_dirs`).

:func:`where` reports where a task reads from with the loaders' own search
(:mod:`simpletron_jax.data.tasks` and each reader's ``find_*`` function), or one line naming the
file to fetch, its address and the command that puts it in place. :func:`prepare` writes the
files into ``--dest`` (default ``~/data``, where the loaders look without a flag) with a
manifest, ``simpletron_prepared.json``: each output's size and SHA-256, and the source's size
and MD5. :func:`verify` checks a task's data: the manifest's checksums, the source archive's
MD5 where it is published, the example counts where they are known, and the label balance
where it is known (CIFAR-10, IMDB, AG News: equal classes); elsewhere it reports the counts.

Task settings (the ListOps and Pathfinder generator arguments, the data folders) come from a
config, ``configs/<task>/transformer.py`` unless ``--config`` names another, with
``--config.<field>=<value>`` overrides (:mod:`simpletron_jax.runtime.overrides`), as for
``train.py``.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import hashlib
import importlib
import io
import json
import os
import pickle
import re
import shutil
import tarfile
import time
import zlib
from typing import Any, Callable, Iterator, Sequence

import ml_collections
import numpy as np

from simpletron_jax.data import tasks
from simpletron_jax.runtime import atomic_io, overrides

TASKS = ("listops", "text", "retrieval", "image", "pathfinder", "pathx", "agnews")
MANIFEST = "simpletron_prepared.json"
MANIFEST_FORMAT = "simpletron_jax.data.prepare/1"
COMMAND = "python -m simpletron_jax.data"


@dataclasses.dataclass(frozen=True)
class Download:
  """A public file a task's data comes from.

  Attributes:
    file: its name.
    url: its address.
    md5: its published MD5 (None when none is published).
    what: what it holds, for the messages.
  """

  file: str
  url: str
  md5: str | None
  what: str


DOWNLOADS = {
    "lra": Download("lra_release.gz",
                    "https://storage.googleapis.com/long-range-arena/lra_release.gz", None,
                    "LRA's release (ListOps, AAN retrieval, Pathfinder, Path-X)"),
    # MD5 as torchvision and others check it.
    "cifar10": Download("cifar-10-python.tar.gz",
                        "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
                        "c58f30108f718f92721af3b95e74349a", "CIFAR-10, python version"),
    # MD5 as torchtext and others check it.
    "imdb": Download("aclImdb_v1.tar.gz",
                     "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz",
                     "7c2ac02c03563afcf9b574c7e56c153a", "IMDB reviews (Maas et al., 2011)"),
    "agnews": Download("ag_news_csv.tgz", "https://s3.amazonaws.com/fast-ai-nlp/ag_news_csv.tgz",
                       None, "AG News CSV release (Zhang et al., 2015)"),
}
"""The public files, by source name."""
TASK_DOWNLOAD = {"listops": "lra", "retrieval": "lra", "pathfinder": "lra", "pathx": "lra",
                 "image": "cifar10", "text": "imdb", "agnews": "agnews"}
"""The download each task's ``prepare --from`` takes."""

# Example counts per split, and examples per class where the classes are balanced.
KNOWN_COUNTS = {
    "text": {"train": 25000, "test": 25000},
    "image": {"train": 50000, "test": 10000},
    "agnews": {"train": 120000, "test": 7600},
    "retrieval": {"train": 147086, "val": 18090, "test": 17437},   # LRA paper, section 3
    "listops_lra": {"train": 96000, "val": 2000, "test": 2000},
}
KNOWN_PER_CLASS = {
    "text": {"train": 12500, "test": 12500},
    "image": {"train": 5000, "test": 1000},
    "agnews": {"train": 30000, "test": 1900},
}
# LRA's Pathfinder configs train on 160,000 images, 80% of a level (configs/lra.py).
LRA_PATHFINDER_IMAGES = 200000

CIFAR_DIR = "cifar-10-batches-py"
CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST = "test_batch"
IMDB_DIR = "aclImdb"
AGNEWS_DIR = "ag_news_csv"
AGNEWS_FILES = ("train.csv", "test.csv", "classes.txt")


class DataError(ValueError):
  """A user's data or source cannot be used; the one-line message names the file and what
  to do."""


# ----------------------------------------------------------------------------
# Config and places.


def task_config(task: str, spec: str | None = None,
                config_overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
  """The config whose data settings a command uses.

  Args:
    task: one of :data:`TASKS`.
    spec: a ``--config`` spec; None: ``configs/<task>/transformer.py`` (the published size;
      ``:tiny`` for the CPU size, which generates less ListOps and Pathfinder data).
    config_overrides: ``--config.<field>=<value>`` arguments.

  Returns:
    The config.

  Raises:
    ValueError: an unknown task (naming ``--task``), or a config or override that cannot be
      loaded (one line, :func:`simpletron_jax.runtime.overrides.load_config`).
  """
  if task not in TASKS:
    raise ValueError(f"--task {task!r} is not a task; the tasks: {', '.join(TASKS)}")
  config = overrides.load_config(spec or f"configs/{task}/transformer.py", config_overrides)
  if config.task != task:
    raise ValueError(f"--config {spec} is a {config.task!r} config, not {task!r}")
  return config


def default_dest() -> str:
  """``~/data`` expanded: where ``prepare`` writes unless ``--dest`` says otherwise."""
  return os.path.expanduser(tasks.DEFAULT_DATA_ROOT)


def fetch_line(task: str, dest: str | None = None) -> str:
  """The one line that says what to fetch for ``task``, from where, and what to run then."""
  d = DOWNLOADS[TASK_DOWNLOAD[task]]
  dest_flag = f" --dest {dest}" if dest else ""
  return (f"{task}: no data found. Fetch {d.file} ({d.what}) from {d.url}, put it anywhere "
          f"(e.g. ~/data/{d.file}) and run: {COMMAND} prepare --task {task} --from "
          f"~/data/{d.file}{dest_flag}")


@dataclasses.dataclass
class Where:
  """Where a task reads its data from.

  Attributes:
    task: the task.
    kind: the source kind (``tfds``, ``npz``, ``jsonl``, ``aclimdb``, ``csv``, ``tsv``,
      ``generated``, ``lra``), or ``missing``.
    path: the file or folder (for ``jsonl`` and ``csv`` the folder of the two files).
    ready: False when the data must still be made (generated on first use) or is missing.
    note: one line for the user.
  """

  task: str
  kind: str
  path: str
  ready: bool
  note: str = ""

  def line(self) -> str:
    """One line: ``<task>: <kind> <path> (<note>)``, or the note alone when missing."""
    if self.kind == "missing":
      return self.note
    return f"{self.task}: {self.kind} {self.path}" + (f" ({self.note})" if self.note else "")


def _generated_listops(args: dict) -> str | None:
  """The folder under ``args['cache_dir']`` that holds ListOps generated with exactly these
  arguments (its ``basic_meta.json`` says so and every TSV is there), or None."""
  from simpletron_jax.data.listops import generate  # pylint: disable=import-outside-toplevel
  args = dict(args)
  cache = os.path.expanduser(args.pop("cache_dir"))
  wanted = generate._generator_args(**args)  # pylint: disable=protected-access
  for meta_path in sorted(glob.glob(os.path.join(glob.escape(cache), "*", "basic_meta.json"))):
    meta = _read_json(meta_path)
    folder = os.path.dirname(meta_path)
    if isinstance(meta, dict) and meta.get("arguments") == wanted and all(
        os.path.isfile(os.path.join(folder, f"basic_{s}.tsv")) for s in ("train", "val", "test")):
      return folder
  return None


def _generated_pathfinder(args: dict) -> str | None:
  """The root under ``args['cache_dir']`` that holds this generated Pathfinder level (its
  ``simpletron_generated.json`` names these arguments), or None."""
  from simpletron_jax.data.pathfinder import generate  # pylint: disable=import-outside-toplevel
  from simpletron_jax.data.pathfinder.params import LEVELS  # pylint: disable=C0415
  cache = os.path.expanduser(args["cache_dir"])
  wanted = generate._generator_args(  # pylint: disable=protected-access
      args["seed"], args["resolution"], args["level"], args["num_images"],
      generate.IMAGES_PER_SHARD, args["generator"])
  level_dir = os.path.join(f"pathfinder{args['resolution']}", LEVELS[wanted["level"]])
  done_file = generate._DONE_FILE  # pylint: disable=protected-access
  for root in sorted(glob.glob(os.path.join(glob.escape(cache), "*"))):
    done = _read_json(os.path.join(root, level_dir, done_file))
    if isinstance(done, dict) and done.get("arguments") == wanted:
      return root
  return None


def _read_json(path: str) -> Any:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def where(task: str, config: ml_collections.ConfigDict) -> Where:
  """Where ``task`` reads its data from under ``config``, found by the loaders' own search.

  Args:
    task: one of :data:`TASKS`.
    config: its config (:func:`task_config`).

  Returns:
    A :class:`Where`; ``kind == "missing"`` with :func:`fetch_line` (or the loader's reason,
    when ``data.data_dir`` names a folder without the data) as its note.
  """
  from simpletron_jax.data import (agnews, image, pathfinder,  # pylint: disable=C0415
                                   retrieval, text)
  data_dir = config.data.get("data_dir")
  try:
    if task == "listops":
      if data_dir:
        folder = os.path.expanduser(data_dir)
        for split in ("train", "val", "test"):
          if not os.path.isfile(os.path.join(folder, f"basic_{split}.tsv")):
            raise FileNotFoundError(f"no basic_{split}.tsv in data.data_dir={data_dir!r}")
        return Where(task, "tsv", folder, True, "set by data.data_dir")
      args = tasks.listops_generator_args(config)
      found = _generated_listops(args)
      if found:
        return Where(task, "generated", found, True, f"data.seed={args['seed']}")
      return Where(task, "generated", args["cache_dir"], False,
                   f"made on first use, or now by {COMMAND} prepare --task listops")
    if task in ("pathfinder", "pathx"):
      if data_dir:
        folder = pathfinder.find_level_dir(data_dir, int(config.data.resolution),
                                           config.data.level)
        return Where(task, "lra", folder, True, "set by data.data_dir")
      args = tasks.pathfinder_generator_args(config)
      found = _generated_pathfinder(args)
      if found:
        return Where(task, "generated", found, True,
                     f"{args['generator']}, data.seed={args['seed']}, {args['num_images']} "
                     f"images")
      return Where(task, "generated", args["cache_dir"], False,
                   f"made on first use, or now by {COMMAND} prepare --task {task}")
    if task == "retrieval":
      folder = tasks.retrieval_data_dir(config)
      if folder is None:
        return Where(task, "missing", "", False, fetch_line(task))
      return Where(task, "tsv", retrieval.find_data_dir(folder), True)
    module = {"text": text, "image": image, "agnews": agnews}[task]
    dirs = (tasks.agnews_source_dirs(config) if task == "agnews"
            else tasks.source_dirs(config, module.TFDS_NAME))
    kind, found = module.find_source(*dirs)
  except FileNotFoundError as e:
    if data_dir or config.data.get("tfds_data_dir"):
      return Where(task, "missing", "", False, f"{task}: {' '.join(str(e).split())}")
    return Where(task, "missing", "", False, fetch_line(task))
  if isinstance(found, dict):   # jsonl / csv: one file per split, in one folder
    found = os.path.dirname(next(iter(found.values())))
  return Where(task, kind, found, True)


# ----------------------------------------------------------------------------
# Files: atomic writes, checksums, the manifest.


def file_digest(path: str, algorithm: str = "sha256") -> str:
  """The hex digest of a file's bytes (``sha256`` or ``md5``)."""
  digest = hashlib.new(algorithm)
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def write_manifest(folder: str, task: str, files: Sequence[str], source: str | None,
                   extra: dict | None = None) -> str:
  """Writes :data:`MANIFEST` in ``folder``: the size and SHA-256 of each of ``files`` (paths
  under ``folder``), and the source's path, size and MD5.

  Returns:
    The manifest's path.
  """
  entries = {}
  for path in files:
    rel = os.path.relpath(path, folder)
    entries[rel] = {"bytes": os.path.getsize(path), "sha256": file_digest(path)}
  src = None
  if source:
    src = {"path": os.path.abspath(source)}
    if os.path.isfile(source):
      src.update(bytes=os.path.getsize(source), md5=file_digest(source, "md5"))
  manifest = {"format": MANIFEST_FORMAT, "task": task, "source": src, "files": entries,
              "made": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **(extra or {})}
  path = os.path.join(folder, MANIFEST)
  with atomic_io.atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
    json.dump(manifest, f, indent=1, sort_keys=True)
    f.write("\n")
  return path


def check_manifest(folder: str) -> list[tuple[str, str]]:
  """Checks the files a :data:`MANIFEST` in ``folder`` lists against their recorded size and
  SHA-256.

  Returns:
    ``(status, line)`` pairs (``ok`` / ``FAIL``), none when there is no manifest.
  """
  manifest = _read_json(os.path.join(folder, MANIFEST))
  if not isinstance(manifest, dict):
    return []
  out = []
  for rel, want in sorted(manifest.get("files", {}).items()):
    path = os.path.join(folder, rel)
    if not os.path.isfile(path):
      out.append(("FAIL", f"{path}: missing (listed in {MANIFEST}); run prepare again"))
    elif os.path.getsize(path) != want["bytes"]:
      out.append(("FAIL", f"{path}: {os.path.getsize(path)} bytes, {MANIFEST} says "
                          f"{want['bytes']}; run prepare again"))
    elif file_digest(path) != want["sha256"]:
      out.append(("FAIL", f"{path}: SHA-256 differs from {MANIFEST}'s; run prepare again"))
    else:
      out.append(("ok", f"{path}: {want['bytes']} bytes, SHA-256 as made"))
  return out


def check_download(task: str, path: str) -> tuple[str, str]:
  """Checks a downloaded file against its published MD5 (:data:`DOWNLOADS`).

  Returns:
    ``("ok" | "FAIL" | "note", line)``.
  """
  d = DOWNLOADS[TASK_DOWNLOAD[task]]
  if not os.path.isfile(path):
    return "note", f"{path}: a folder, not {d.file}; its files are checked below"
  if d.md5 is None:
    return "note", f"{path}: {os.path.getsize(path)} bytes; no MD5 is published for {d.file}"
  md5 = file_digest(path, "md5")
  if md5 != d.md5:
    return "FAIL", (f"{path}: MD5 {md5}, the published {d.file} has {d.md5}; fetch it again "
                    f"from {d.url}")
  return "ok", f"{path}: MD5 {md5}, as published for {d.file}"


# ----------------------------------------------------------------------------
# Archives.


def _member_parts(name: str) -> list[str] | None:
  """The path parts of an archive member, or None when it would leave the destination."""
  name = name.replace("\\", "/")
  if name.startswith("/"):
    return None
  parts = [p for p in name.split("/") if p not in ("", ".")]
  return None if any(p == ".." for p in parts) else parts


def _iter_tar(path: str) -> Iterator[tuple[list[str], Callable[[], Any]]]:
  """``(parts, open)`` for each regular file of a (compressed) tar archive, in archive
  order, streamed (the archive is read once).

  Raises:
    DataError: when ``path`` is not a tar archive (naming it).
  """
  try:
    with tarfile.open(path, mode="r|*") as tar:
      for member in tar:
        parts = _member_parts(member.name)
        if not member.isfile() or parts is None:
          continue
        yield parts, lambda m=member: tar.extractfile(m)
  except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
    raise DataError(f"{path}: not a readable tar archive ({type(e).__name__}: {e}); fetch "
                    "it again") from None


def _copy_stream(src, path: str) -> None:
  with atomic_io.atomic_path(path) as tmp, open(tmp, "wb") as out:
    shutil.copyfileobj(src, out, 1 << 20)


def _find(parts: Sequence[str], anchor: Sequence[str]) -> int | None:
  """The index after ``anchor`` (consecutive parts) in ``parts``, or None."""
  n = len(anchor)
  for i in range(len(parts) - n + 1):
    if list(parts[i:i + n]) == list(anchor):
      return i + n
  return None


def extract_lra(archive: str, dest: str, anchor: Sequence[str],
                keep: Callable[[list[str]], bool] = lambda rest: True,
                log: Callable[[str], None] = print) -> list[str]:
  """Copies the files of LRA's release under ``anchor`` out of ``lra_release.gz``.

  A member ``.../<anchor>/<rest>`` (wherever the anchor sits in its path, so a doubly nested
  ``lra_release/lra_release/...`` works too) becomes ``{dest}/lra_release/<anchor>/<rest>``.

  Args:
    archive: ``lra_release.gz``.
    dest: the destination root.
    anchor: e.g. ``["tsv_data"]`` or ``["pathfinder32", "curv_contour_length_14"]``.
    keep: which ``rest`` parts to copy.
    log: progress lines.

  Returns:
    The paths written, in archive order.

  Raises:
    DataError: not a tar archive, or nothing under ``anchor`` in it.
  """
  log(f"reading {archive} (all of it: a few minutes for LRA's 7 GB release) for "
      f"{'/'.join(anchor)}/")
  written = []
  for parts, open_member in _iter_tar(archive):
    at = _find(parts, anchor)
    if at is None or at == len(parts) or not keep(parts[at:]):
      continue
    path = os.path.join(dest, "lra_release", *anchor, *parts[at:])
    with open_member() as src:
      _copy_stream(src, path)
    written.append(path)
    if len(written) % 20000 == 0:
      log(f"  {len(written)} files")
  if not written:
    raise DataError(f"{archive} holds no {'/'.join(anchor)}/ files: is it LRA's "
                    f"{DOWNLOADS['lra'].file} ({DOWNLOADS['lra'].url})?")
  return written


# ----------------------------------------------------------------------------
# CIFAR-10: the python batches to the grayscale npz.


class _BatchUnpickler(pickle.Unpickler):
  """Reads CIFAR-10's python batches (Python 2 pickles of dicts, lists, bytes and one uint8
  array) and nothing else: any other global a pickle names is refused, so a tampered file
  cannot run code."""

  # numpy's array reconstruction; ``_codecs.encode`` is how a Python 3 protocol-2 pickle
  # writes bytes (Python 2's, the release's, needs no global for them).
  _ALLOWED = {("numpy", "ndarray"), ("numpy", "dtype"),
              ("numpy.core.multiarray", "_reconstruct"),
              ("numpy._core.multiarray", "_reconstruct"),
              ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
              ("_codecs", "encode")}

  def find_class(self, module, name):
    """The allowed names; raises ``pickle.UnpicklingError`` for any other."""
    if (module, name) not in self._ALLOWED:
      raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR batch")
    if module == "numpy":
      return getattr(np, name)
    if module == "_codecs":
      return importlib.import_module("_codecs").encode
    try:
      multiarray = importlib.import_module("numpy._core.multiarray")
    except ImportError:   # numpy 1.x
      multiarray = importlib.import_module("numpy.core.multiarray")
    return getattr(multiarray, name)


def read_cifar_batch(data: bytes, where: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
  """One python batch of CIFAR-10.

  Args:
    data: the pickled batch (a dict with ``data`` ``[N, 3072]`` uint8, the red, green and
      blue 32x32 planes in turn, ``labels`` and ``filenames``).
    where: the file, for the messages.

  Returns:
    ``(rgb [N, 32, 32, 3] uint8, labels [N] int64, file names)``.

  Raises:
    DataError: naming ``where`` when it is not such a batch.
  """
  try:
    batch = _BatchUnpickler(io.BytesIO(data), encoding="bytes").load()
    batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
    pixels = np.asarray(batch["data"], dtype=np.uint8)
    labels = np.asarray(batch["labels"], dtype=np.int64)
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in batch["filenames"]]
  except (pickle.UnpicklingError, AttributeError, KeyError, TypeError, ValueError, EOFError) as e:
    raise DataError(f"{where}: not a CIFAR-10 python batch ({type(e).__name__}: {e}); fetch "
                    f"{DOWNLOADS['cifar10'].file} again from {DOWNLOADS['cifar10'].url}") from None
  if pixels.ndim != 2 or pixels.shape[1] != 3072 or len(labels) != len(pixels) or (
      len(names) != len(pixels)):
    raise DataError(f"{where}: expected data [N, 3072] with N labels and file names, found "
                    f"data {pixels.shape}, {len(labels)} labels, {len(names)} names")
  rgb = pixels.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
  return rgb, labels, names


def _cifar_batches(source: str) -> dict[str, bytes]:
  """The batch files' bytes from the tarball or a folder (``cifar-10-batches-py`` or one
  above it).

  Raises:
    DataError: a batch is missing (naming the source).
  """
  wanted = (*CIFAR_TRAIN, CIFAR_TEST)
  found: dict[str, bytes] = {}
  if os.path.isdir(source):
    for folder in (source, os.path.join(source, CIFAR_DIR)):
      if all(os.path.isfile(os.path.join(folder, n)) for n in wanted):
        for n in wanted:
          with open(os.path.join(folder, n), "rb") as f:
            found[n] = f.read()
        break
  else:
    for parts, open_member in _iter_tar(source):
      if len(parts) >= 2 and parts[-2] == CIFAR_DIR and parts[-1] in wanted:
        with open_member() as f:
          found[parts[-1]] = f.read()
  missing = [n for n in wanted if n not in found]
  if missing:
    raise DataError(f"{source}: no {CIFAR_DIR}/{', '.join(missing)}; expected "
                    f"{DOWNLOADS['cifar10'].file} ({DOWNLOADS['cifar10'].url}) or its "
                    f"{CIFAR_DIR} folder")
  return found


def cifar_npz(source: str, out_path: str) -> dict[str, int]:
  """Makes the grayscale npz the image task reads from CIFAR-10's python release.

  Grayscale is :func:`simpletron_jax.data.image.rgb_to_grayscale`, the arithmetic of
  ``tf.image.rgb_to_grayscale`` (weights 0.2989, 0.5870, 0.1140 on ``x / 255`` in float32,
  back to uint8 as ``floor(255.5 * gray)``), which LRA's image pipeline applies. Each split is
  stored in the order tfds stores it (:func:`simpletron_jax.data.image.tfds_order`), so LRA's
  ``train[:90%]`` is the first 45,000 images (``data.lra_split``).

  Args:
    source: ``cifar-10-python.tar.gz`` or its ``cifar-10-batches-py`` folder.
    out_path: the ``.npz`` to write (atomically).

  Returns:
    Images per split.

  Writes arrays ``x_train`` ``[50000, 32, 32]`` uint8, ``y_train`` uint8, ``x_test``,
  ``y_test``, ``classes`` (the names), ``names_train`` / ``names_test`` (the release's file
  names) and ``index_train`` / ``index_test`` (each image's index in the release: over
  ``data_batch_1..5``, or in ``test_batch``).

  Raises:
    DataError: a missing or damaged batch (naming it).
  """
  from simpletron_jax.data import image  # pylint: disable=import-outside-toplevel
  raw = _cifar_batches(source)
  arrays: dict[str, Any] = {"classes": np.asarray(image.CLASSES)}
  counts = {}
  for split, names in (("train", CIFAR_TRAIN), ("test", (CIFAR_TEST,))):
    parts = [read_cifar_batch(raw[n], f"{source}:{CIFAR_DIR}/{n}") for n in names]
    rgb = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    files = [name for p in parts for name in p[2]]
    if labels.size and (labels.min() < 0 or labels.max() >= image.NUM_CLASSES):
      raise DataError(f"{source}: {split} labels outside 0..9")
    order = image.tfds_order(len(labels), split)
    arrays[f"x_{split}"] = image.rgb_to_grayscale(rgb[order])
    arrays[f"y_{split}"] = labels[order].astype(np.uint8)
    arrays[f"names_{split}"] = np.asarray(files)[order] if files else np.asarray([], "<U1")
    arrays[f"index_{split}"] = order
    counts[split] = int(len(labels))
  with atomic_io.atomic_path(out_path) as tmp:
    with open(tmp, "wb") as f:
      np.savez_compressed(f, **arrays)
  return counts


# ----------------------------------------------------------------------------
# IMDB: aclImdb to the JSON-lines files.


_ACL_FILE = re.compile(r"^(\d+)_(\d+)\.txt$")


def _acl_reviews(source: str) -> Iterator[tuple[str, int, int, int, bytes, str]]:
  """``(split, label, id, rating, text, where)`` of every review in ``aclImdb``'s
  ``{train,test}/{neg,pos}/{id}_{rating}.txt``, from the tarball or a folder (``aclImdb`` or
  one above it)."""
  from simpletron_jax.data import text  # pylint: disable=import-outside-toplevel

  def parse(parts):
    if len(parts) < 4 or parts[-4] != IMDB_DIR or parts[-3] not in ("train", "test") or (
        parts[-2] not in text.CLASSES):
      return None
    m = _ACL_FILE.match(parts[-1])
    return None if m is None else (parts[-3], text.CLASSES.index(parts[-2]), int(m.group(1)),
                                   int(m.group(2)))
  if os.path.isdir(source):
    root = source if os.path.basename(os.path.normpath(source)) == IMDB_DIR else os.path.join(
        source, IMDB_DIR)
    for split in ("train", "test"):
      for name in text.CLASSES:
        folder = os.path.join(root, split, name)
        for file in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
          key = parse([IMDB_DIR, split, name, file])
          if key:
            with open(os.path.join(folder, file), "rb") as f:
              yield (*key, f.read(), os.path.join(folder, file))
    return
  for parts, open_member in _iter_tar(source):
    key = parse(parts)
    if key:
      with open_member() as f:
        yield (*key, f.read(), f"{source}:{'/'.join(parts)}")


def imdb_jsonl(source: str, out_dir: str) -> dict[str, int]:
  """Makes ``imdb_train.jsonl.gz`` and ``imdb_test.jsonl.gz`` (the text reader's JSON-lines
  format, :func:`simpletron_jax.data.text.read_jsonl`) from the ``aclImdb`` release.

  Each line is ``{"id", "rating", "label", "text"}``: the id and rating from the file name
  ``{id}_{rating}.txt``, label 0 (``neg``) or 1 (``pos``), the text the file's UTF-8 stripped
  of surrounding whitespace, as tfds's ``imdb_reviews`` serves it; ordered by label, then id
  (the reader shuffles). The gzip headers carry no time, so the same release gives the same
  bytes.

  Args:
    source: ``aclImdb_v1.tar.gz`` or its ``aclImdb`` folder (or one above it).
    out_dir: the folder for the two files.

  Returns:
    Reviews per split.

  Raises:
    DataError: a review that is not UTF-8 (naming it), or a split without reviews.
  """
  from simpletron_jax.data import text  # pylint: disable=import-outside-toplevel
  records: dict[str, list] = {"train": [], "test": []}
  for split, label, review_id, rating, raw, where_ in _acl_reviews(source):
    try:
      body = raw.strip().decode("utf-8")
    except UnicodeDecodeError as e:
      raise DataError(f"{where_}: not UTF-8 ({e})") from None
    records[split].append((label, review_id, rating, body))
  counts = {}
  for split, rows in records.items():
    if not rows:
      raise DataError(f"{source}: no {IMDB_DIR}/{split}/{{neg,pos}}/*.txt reviews; expected "
                      f"{DOWNLOADS['imdb'].file} ({DOWNLOADS['imdb'].url}) or its folder")
    rows.sort()
    path = os.path.join(out_dir, text.JSONL_FILES[split])
    with atomic_io.atomic_path(path) as tmp:
      with open(tmp, "wb") as raw_out, gzip.GzipFile(filename="", mode="wb", fileobj=raw_out,
                                                       mtime=0) as out:
        for label, review_id, rating, body in rows:
          line = {"id": review_id, "rating": rating, "label": label, "text": body}
          out.write(json.dumps(line, ensure_ascii=False).encode("utf-8") + b"\n")
    counts[split] = len(rows)
  return counts


# ----------------------------------------------------------------------------
# prepare.


def _agnews_files(source: str, out_dir: str) -> list[str]:
  """Copies ``train.csv``, ``test.csv`` (and ``classes.txt``) of the AG News CSV release."""
  written = []
  if os.path.isdir(source):
    folder = next((f for f in (source, os.path.join(source, AGNEWS_DIR))
                   if os.path.isfile(os.path.join(f, "train.csv"))), source)
    for name in AGNEWS_FILES:
      if os.path.isfile(os.path.join(folder, name)):
        with open(os.path.join(folder, name), "rb") as src:
          _copy_stream(src, os.path.join(out_dir, name))
        written.append(os.path.join(out_dir, name))
  else:
    for parts, open_member in _iter_tar(source):
      if parts[-1] in AGNEWS_FILES and (len(parts) == 1 or parts[-2] == AGNEWS_DIR):
        with open_member() as src:
          _copy_stream(src, os.path.join(out_dir, parts[-1]))
        written.append(os.path.join(out_dir, parts[-1]))
  missing = [n for n in AGNEWS_FILES[:2] if os.path.join(out_dir, n) not in written]
  if missing:
    raise DataError(f"{source}: no {AGNEWS_DIR}/{', '.join(missing)}; expected "
                    f"{DOWNLOADS['agnews'].file} ({DOWNLOADS['agnews'].url}) or its folder")
  return written


def _data_dir_line(task: str, folder: str) -> str:
  """The line telling the user which flag points training at ``folder``."""
  return f"{task}: ready in {folder}; train with --config.data.data_dir={folder}"


def prepare(task: str, config: ml_collections.ConfigDict, source: str | None = None,
            dest: str | None = None, num_workers: int | None = None,
            log: Callable[[str], None] = print) -> Where:
  """Puts ``task``'s data where the loaders find it.

  * ``listops``, ``pathfinder``, ``pathx`` without ``source``: generates the data the config
    names into the cache, exactly as training would on first use
    (:func:`simpletron_jax.data.tasks.listops_generator_args`, ``pathfinder_generator_args``).
  * with ``source`` = ``lra_release.gz``: copies the task's part of LRA's release
    (``listops-1000/basic_*.tsv``; ``tsv_data/new_aan_pairs.*.tsv``; the config's Pathfinder
    level) into ``{dest}/lra_release/``; an unpacked release folder is used where it is.
  * ``image``: ``cifar-10-python.tar.gz`` -> ``{dest}/cifar10/cifar10_gray_uint8.npz``
    (:func:`cifar_npz`); ``text``: ``aclImdb_v1.tar.gz`` -> ``{dest}/imdb/imdb_*.jsonl.gz``
    (:func:`imdb_jsonl`); ``agnews``: ``ag_news_csv.tgz`` -> ``{dest}/ag_news_csv/``.
  * without ``source`` for the others: reports the data the loaders already find, or raises
    with :func:`fetch_line`.

  Every folder written gets a :data:`MANIFEST`.

  Args:
    task: one of :data:`TASKS`.
    config: :func:`task_config`.
    source: the downloaded file or unpacked folder (``--from``), or None.
    dest: the destination root (``--dest``); None: ``~/data``.
    num_workers: generator processes (ListOps, Pathfinder); None: every CPU.
    log: progress lines.

  Returns:
    Where the task's data now is: the copy made (image, text, agnews; a line says which flag
    reads it when the loaders would find another source first), or :func:`where` under the
    config, pointed at LRA's files when they came from ``source``.

  Raises:
    DataError: a missing source (one line: what to fetch, from where, what to run), or a
      source that is not what it should be (naming it).
  """
  dest = os.path.abspath(os.path.expanduser(dest or default_dest()))
  if source is not None:
    source = os.path.abspath(os.path.expanduser(source))
    if not os.path.exists(source):
      d = DOWNLOADS[TASK_DOWNLOAD[task]]
      raise DataError(f"--from {source}: no such file or folder; fetch {d.file} ({d.what}) "
                      f"from {d.url} and pass its path")
  if source is None:
    if task == "listops":
      from simpletron_jax.data import listops  # pylint: disable=import-outside-toplevel
      folder = listops.ensure_generated(num_workers=num_workers,
                                        **tasks.listops_generator_args(config))
      paths = [os.path.join(folder, f"basic_{s}.tsv") for s in ("train", "val", "test")]
      write_manifest(folder, task, paths, None, {"generated": True})
      return where(task, config)
    if task in ("pathfinder", "pathx"):
      from simpletron_jax.data import pathfinder  # pylint: disable=import-outside-toplevel
      pathfinder.ensure_generated(num_workers=num_workers,
                                  **tasks.pathfinder_generator_args(config))
      found = where(task, config)
      level = pathfinder.find_level_dir(found.path, int(config.data.resolution),
                                        config.data.level)
      write_manifest(level, task, sorted(glob.glob(os.path.join(level, "metadata", "*.npy"))),
                     None, {"generated": True})
      return found
    found = where(task, config)
    if found.kind == "missing":
      raise DataError(found.note)
    log(f"{task}: already in place; nothing to do")
    return found
  if TASK_DOWNLOAD[task] == "lra":
    return _prepare_from_lra(task, config, source, dest, log)
  if task == "image":
    from simpletron_jax.data import image  # pylint: disable=import-outside-toplevel
    out = os.path.join(dest, "cifar10", image.NPZ_NAME)
    log(f"image: {source} -> {out}")
    counts = cifar_npz(source, out)
    write_manifest(os.path.dirname(out), task, [out], source, {"images": counts})
    made = Where(task, "npz", out, True)
  elif task == "text":
    from simpletron_jax.data import text  # pylint: disable=import-outside-toplevel
    out = os.path.join(dest, "imdb")
    log(f"text: {source} -> {out}")
    counts = imdb_jsonl(source, out)
    write_manifest(out, task, [os.path.join(out, n) for n in text.JSONL_FILES.values()],
                   source, {"reviews": counts})
    made = Where(task, "jsonl", out, True)
  else:   # agnews
    out = os.path.join(dest, AGNEWS_DIR)
    log(f"agnews: {source} -> {out}")
    write_manifest(out, task, _agnews_files(source, out), source)
    made = Where(task, "csv", out, True)
  found = where(task, config)   # what the loaders read under this config
  if found.path != made.path:
    folder = out if os.path.isdir(out) else os.path.dirname(out)
    log(f"{task}: with this config the loaders read {found.line()}; "
        f"train with --config.data.data_dir={folder} to read the copy made here")
  return made


def _prepare_from_lra(task: str, config: ml_collections.ConfigDict, source: str, dest: str,
                      log: Callable[[str], None]) -> Where:
  """:func:`prepare` from LRA's release (the archive, or an unpacked folder used in place)."""
  from simpletron_jax.data import pathfinder, retrieval  # pylint: disable=C0415
  from simpletron_jax.data.pathfinder.params import LEVELS  # pylint: disable=C0415
  config = config.copy_and_resolve_references()
  if task == "retrieval":
    anchor, keep = ["tsv_data"], lambda rest: rest in ([n] for n in retrieval.SPLIT_FILES.values())
  elif task == "listops":
    names = [f"basic_{s}.tsv" for s in ("train", "val", "test")]
    anchor, keep = ["listops-1000"], lambda rest: rest in ([n] for n in names)
  else:
    level_dir = LEVELS[pathfinder.params._level_name(config.data.level)]  # pylint: disable=W0212
    anchor = [f"pathfinder{int(config.data.resolution)}", level_dir]
    keep = lambda rest: rest[0] in ("imgs", "metadata")  # noqa: E731
  if os.path.isdir(source):   # already unpacked: read it where it is
    folder = source
  else:
    written = extract_lra(source, dest, anchor, keep, log)
    folder = os.path.join(dest, "lra_release", *anchor)
    if task in ("pathfinder", "pathx"):   # checksums of the metadata; the images are counted
      listed = [p for p in written if os.sep + "metadata" + os.sep in p]
    else:
      listed = written
    write_manifest(folder, task, listed, source, {"files_extracted": len(written)})
    folder = os.path.join(dest, "lra_release")
  if task == "retrieval":
    tsv_dir = retrieval.find_data_dir(folder)
    if os.path.abspath(os.path.expanduser(tasks.DEFAULT_LRA_DIR)) != os.path.abspath(folder):
      log(_data_dir_line(task, tsv_dir))
    config.data.data_dir = tsv_dir
  elif task == "listops":
    found = next((f for f in (folder, os.path.join(folder, "listops-1000"),
                              os.path.join(folder, "lra_release", "listops-1000"))
                  if os.path.isfile(os.path.join(f, "basic_train.tsv"))), None)
    if found is None:
      raise DataError(f"{source}: no listops-1000/basic_train.tsv in it; point --from at "
                      f"{DOWNLOADS['lra'].file} or the folder it was unpacked to")
    log(_data_dir_line(task, found))
    config.data.data_dir = found
  else:
    pathfinder.find_level_dir(folder, int(config.data.resolution), config.data.level)
    log(_data_dir_line(task, folder))
    config.data.data_dir = folder
  return where(task, config)


# ----------------------------------------------------------------------------
# verify.


def _tfds_counts(version_dir: str) -> dict[str, int]:
  """Examples per split of a prepared tfds data set, from its ``dataset_info.json``."""
  info = _read_json(os.path.join(version_dir, "dataset_info.json")) or {}
  out = {}
  for split in info.get("splits", []):
    lengths = split.get("shardLengths") or []
    out[split.get("name")] = sum(int(n) for n in lengths)
  return out


def _count_checks(task: str, counts: dict[str, int], known: dict[str, int] | None,
                  what: str, strict: bool = True, generated: bool = False
                  ) -> list[tuple[str, str]]:
  """Each split's count against ``known`` (the published sizes, or the generator's for
  ``generated`` data); a mismatch fails when ``strict``, else it is a note."""
  out = []
  same, other = (("as the config asks", "the config asks for") if generated
                 else ("as published", "the published data has"))
  for split, n in counts.items():
    want = (known or {}).get(split)
    if want is None:
      out.append(("note", f"{task} {split}: {n:,} {what}"))
    elif n == want:
      out.append(("ok", f"{task} {split}: {n:,} {what}, {same}"))
    else:
      out.append(("FAIL" if strict else "note", f"{task} {split}: {n:,} {what}, {other} "
                                                f"{want:,}"))
  return out


def _balance_checks(task: str, labels: dict[str, np.ndarray],
                    per_class: dict[str, int] | None, num_classes: int) -> list[tuple[str, str]]:
  out = []
  for split, y in labels.items():
    hist = np.bincount(np.asarray(y, dtype=np.int64), minlength=num_classes).tolist()
    want = (per_class or {}).get(split)
    if want is None:
      out.append(("note", f"{task} {split}: examples per label {hist}"))
    elif all(h == want for h in hist):
      out.append(("ok", f"{task} {split}: {want:,} examples per label, balanced as published"))
    else:
      out.append(("FAIL", f"{task} {split}: examples per label {hist}, the published data has "
                          f"{want:,} each"))
  return out


def verify(task: str, config: ml_collections.ConfigDict, source: str | None = None
           ) -> list[tuple[str, str]]:
  """Checks the data ``task`` reads under ``config`` (see the module docstring).

  Args:
    task: one of :data:`TASKS`.
    config: :func:`task_config`.
    source: a downloaded file to check against its published MD5 too (``--from``).

  Returns:
    ``(status, line)`` pairs, status ``ok``, ``FAIL`` or ``note``; a missing source is one
    ``FAIL`` with :func:`fetch_line`'s advice.

  Raises:
    ValueError: a malformed data file (``file:line``, from the readers).
  """
  from simpletron_jax.data import (agnews, image, listops, pathfinder,  # pylint: disable=C0415
                                   retrieval, text)
  checks: list[tuple[str, str]] = []
  if source:
    checks.append(check_download(task, os.path.abspath(os.path.expanduser(source))))
  found = where(task, config)
  if found.kind == "missing":
    return checks + [("FAIL", found.note)]
  if not found.ready:
    return checks + [("FAIL", f"{task}: not generated yet in {found.path}; run {COMMAND} "
                              f"prepare --task {task}")]
  checks.append(("note", found.line()))
  folder = found.path if os.path.isdir(found.path) else os.path.dirname(found.path)
  checks += check_manifest(folder)
  labels: dict[str, np.ndarray] = {}
  counts: dict[str, int] = {}
  known_counts, per_class, strict = KNOWN_COUNTS.get(task), KNOWN_PER_CLASS.get(task), True
  if found.kind == "tfds":
    counts = _tfds_counts(found.path)
  elif task == "text":
    _, src = text.find_source(found.path, None)
    for split in ("train", "test"):
      y = (text.read_jsonl(src[split])[1] if found.kind == "jsonl"
           else text.read_acl_imdb(src, split)[1])
      labels[split], counts[split] = y, len(y)
  elif task == "image":
    for split, (_, y) in image.read_npz(found.path).items():
      labels[split], counts[split] = y, len(y)
    if image.npz_in_tfds_order(found.path):
      checks.append(("ok", f"{found.path}: training images in tfds's order "
                           "(data.lra_split=True is LRA's split)"))
  elif task == "agnews":
    for split in ("train", "test"):
      y = agnews.read_csv(os.path.join(found.path, agnews.CSV_FILES[split]))[1]
      labels[split], counts[split] = y, len(y)
  elif task == "retrieval":
    for split, name in retrieval.SPLIT_FILES.items():
      y = retrieval.read_split(os.path.join(found.path, name), 1)[0].labels
      labels[split], counts[split] = y, len(y)
  elif task == "listops":
    for split in ("train", "val", "test"):
      y = listops.load_split(found.path, split).labels
      labels[split], counts[split] = y, len(y)
    if found.kind == "generated":
      args = tasks.listops_generator_args(config)
      known_counts = {s: int(args[f"num_{s}"]) for s in ("train", "val", "test")}
    else:
      known_counts = KNOWN_COUNTS["listops_lra"]
  else:   # pathfinder, pathx
    level_dir = pathfinder.find_level_dir(found.path, int(config.data.resolution),
                                          config.data.level)
    if os.path.abspath(level_dir) != os.path.abspath(folder):
      checks += check_manifest(level_dir)
    rows = pathfinder.read_metadata(level_dir)
    absent = [w for f, n, _, w in rows if not os.path.isfile(os.path.join(level_dir, f, n))]
    checks.append(("FAIL", f"{len(absent)} images listed but absent, the first at "
                           f"{absent[0]}") if absent else
                  ("ok", f"{level_dir}: every listed image is there"))
    labels["all"] = np.asarray([label for _, _, label, _ in rows])
    counts["all"] = len(rows)
    if found.kind == "generated":
      known_counts = {"all": int(config.data.num_images)}
    else:
      known_counts, strict = {"all": LRA_PATHFINDER_IMAGES}, False
  checks += _count_checks(task, counts, known_counts,
                          "images" if task in ("image", "pathfinder", "pathx") else "examples",
                          strict, generated=found.kind == "generated")
  num_classes = {"image": 10, "agnews": 4, "listops": 10}.get(task, 2)
  checks += _balance_checks(task, labels, per_class, num_classes)
  return checks
