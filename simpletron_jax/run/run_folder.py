"""A ``train.py`` run's folder: its layout, lock, run id, ``config.json``, ``metrics.jsonl``
and ``results.json`` (docs/runs.md). Imports no JAX, so ``train.py`` can name its files
before JAX starts; the checkpoints in ``checkpoints/`` are read by ``train.saved_runs``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
import uuid
from typing import Any, Callable

import filelock
import ml_collections

from simpletron_jax.runtime import atomic_io, cli, errors
from simpletron_jax.run import metric_logging, run_record

CONFIG_FILE, METRICS_FILE, RESULTS_FILE = "config.json", "metrics.jsonl", "results.json"
CHECKPOINTS_DIR, DAMAGED_DIR, PROFILE_DIR = "checkpoints", "damaged", "profile"
LOCK_FILE, RUN_ID_FILE, TRANSFER_FILE = "run.lock", "run_id", "transfer.json"
_HELD: dict[str, filelock.BaseFileLock] = {}   # lock path -> the lock this process holds


class RunFolder:
  """The folder ``workdir`` of one run lineage; only process ``process_index`` 0 writes.

  Attributes:
    config_path, metrics_path, results_path, checkpoints_dir, damaged_dir, profile_dir:
      the run's files and folders.
  """

  def __init__(self, workdir: str, process_index: int = 0, process_count: int = 1):
    self.workdir, self.process_index, self.process_count = workdir, process_index, process_count
    self.writer = process_index == 0
    self.config_path, self.metrics_path, self.results_path = (
        self.path(CONFIG_FILE), self.path(METRICS_FILE), self.path(RESULTS_FILE))
    self.checkpoints_dir, self.damaged_dir, self.profile_dir = (
        self.path(CHECKPOINTS_DIR), self.path(DAMAGED_DIR), self.path(PROFILE_DIR))
    self._lock: filelock.BaseFileLock | None = None

  def path(self, name: str) -> str:
    """``workdir/name``."""
    return os.path.join(self.workdir, name)

  def create(self) -> None:
    """Creates ``workdir`` (and its parents) unless it exists as a folder.

    Raises:
      NotADirectoryError: ``workdir`` (or a folder on its path) is a file.
      OSError: of the same type, naming ``workdir``, when it cannot be created.
      ValueError: its name is not UTF-8 text (:func:`cli.check_path_name`).
    """
    cli.check_path_name(self.workdir, "--workdir")
    if os.path.exists(self.workdir) and not os.path.isdir(self.workdir):
      raise NotADirectoryError(f"--workdir {self.workdir!r} is a file, not a folder: pass a "
                               "folder (created if missing) or move the file away")
    try:
      os.makedirs(self.workdir, exist_ok=True)
    except OSError as e:
      raise type(e)(f"--workdir {self.workdir!r} cannot be created: {e.strerror or e} "
                    f"({e.filename or self.workdir}); pass a folder in a writable place") from e

  def lock(self) -> None:
    """Takes the workdir lock on process 0 (:func:`acquire_lock`); raises as it does."""
    if self.writer:
      self._lock = acquire_lock(self.workdir)

  def unlock(self) -> None:
    """Releases the workdir lock, if held."""
    release_lock(self._lock)
    self._lock = None

  def run_id(self, resumed: str | None) -> str:
    """The run id: ``resumed`` (the checkpoint's) if given, else ``workdir/run_id``'s, else a
    new random one; written to ``workdir/run_id``. On several hosts, process 0's.

    Raises:
      ValueError: ``workdir/run_id`` is empty or, on several hosts, not 32 hex digits.
    """
    path = self.path(RUN_ID_FILE)
    run_id = resumed
    if run_id is None and os.path.exists(path):
      with open(path, encoding="utf-8") as f:
        run_id = f.read().strip()
      if not run_id:
        raise ValueError(f"{path}: empty run id; delete the file to start a new run lineage")
    run_id = run_id or uuid.uuid4().hex
    if self.process_count > 1:
      from simpletron_jax.runtime import distributed  # pylint: disable=import-outside-toplevel
      run_id = distributed.hex_id_from_process_0(run_id, path)
    if self.writer:
      atomic_io.write_text_atomic(path, run_id + "\n")
    return run_id

  def read_config(self) -> dict[str, Any] | None:
    """``config.json`` as a dict, or None when missing or unreadable."""
    return run_record.read_config_json(self.config_path)

  def saved_config(self) -> ml_collections.ConfigDict:
    """The config the run saved in ``config.json`` (history and software left out).

    Raises:
      FileNotFoundError: the file is missing.
      ValueError: it is not a JSON object.
    """
    if not os.path.exists(self.config_path):
      raise FileNotFoundError(f"{self.config_path} not found: is {self.workdir!r} a train.py "
                              "workdir? Pass --config to evaluate with an explicit config.")
    tree = self.read_config()
    if tree is None:
      raise ValueError(f"{self.config_path} is not a JSON object (damaged?); pass --config to "
                       "evaluate with an explicit config")
    for key in run_record.NOT_CONFIG_KEYS:
      tree.pop(key, None)
    return ml_collections.ConfigDict(tree)

  def write_config(self, tree: dict[str, Any]) -> None:
    """Writes ``config.json`` atomically (process 0); raises ``errors.WriteError``."""
    if self.writer:
      atomic_io.write_json_atomic(self.config_path, tree)

  def earlier_records(self, start_step: int) -> dict[tuple[int, str], dict[str, Any]]:
    """``{(step, split): record}`` of ``metrics.jsonl``'s ``val``, ``test`` and ``test_final``
    records at or before ``start_step`` (the last of each); empty for a fresh start.

    Raises:
      ValueError: ``path:line:`` for a damaged line (:func:`metric_logging.read_records`).
    """
    if start_step <= 0 or not os.path.exists(self.metrics_path):
      return {}
    return {(r["step"], r["split"]): r for r in metric_logging.read_records(self.metrics_path)
            if r["step"] <= start_step and r.get("split") in ("val", "test", "test_final")}

  def finished_results(self, problem: str | None, step: int,
                       agree: Callable[[bool], bool]) -> dict[str, Any] | None:
    """``results.json`` (of a run trained to ``step``) when process 0's ``problem`` with it is
    None (:func:`run_record.workdir_results_problem` of the run's config, forced changes
    counted), else None; ``agree(flag)`` gives process 0's flag on every host
    (``distributed.agree_on_flag``).

    Raises:
      OSError, ValueError: another host cannot read the file process 0 found.
    """
    if not agree(problem is None):
      return None
    with open(self.results_path, encoding="utf-8") as f:
      results = json.load(f)
    print(f"{self.workdir} finished training at step {step} and {self.results_path} is its "
          "result: nothing to do, nothing rewritten", file=sys.stderr)
    return results

  def drop_results(self, start_step: int) -> None:
    """Removes (process 0) the ``results.json`` of an earlier run that this start, from
    ``start_step``, trains past; raises ``errors.WriteError`` naming it."""
    if not (self.writer and os.path.exists(self.results_path)):
      return
    try:
      os.remove(self.results_path)
    except OSError as e:
      raise errors.WriteError(
          f"could not remove {self.results_path}, the results of an earlier run that this one "
          f"trains past (from step {start_step}): {e.strerror or e}. Delete it, then rerun "
          "the same command.") from e
    print(f"removed {self.results_path} of an earlier run; it is written again when this run "
          "ends", file=sys.stderr)

  def write_results(self, results: dict[str, Any]) -> None:
    """Writes ``results.json`` atomically (process 0); raises ``errors.WriteError``."""
    if self.writer:
      atomic_io.write_json_atomic(self.results_path, results)

  def write_transfer(self, report: dict[str, Any]) -> None:
    """Writes ``transfer.json`` (an ``init_from`` report) atomically (process 0)."""
    if self.writer:
      atomic_io.write_json_atomic(self.path(TRANSFER_FILE), report)

  def damaged_checkpoints(self) -> list[str]:
    """The step folders of ``checkpoints/`` that a restore moved to ``damaged/`` (named
    ``checkpoints_<step>_<time>``), sorted; empty when there are none."""
    if not os.path.isdir(self.damaged_dir):
      return []
    prefix = CHECKPOINTS_DIR + "_"
    return sorted(name for name in os.listdir(self.damaged_dir) if name.startswith(prefix))

  def newest_step(self) -> int | None:
    """The newest step folder in ``checkpoints/`` (orbax renames one into place once it is
    written), or None; reads the folder names only."""
    if not os.path.isdir(self.checkpoints_dir):
      return None
    steps = [int(n) for n in os.listdir(self.checkpoints_dir) if n.isdigit()]
    return max(steps) if steps else None

  def remove_if_unstarted(self) -> bool:
    """Removes ``workdir`` when it holds no checkpoint step (a start that trained nothing);
    returns whether it is gone."""
    if not os.path.isdir(self.workdir) or self.newest_step() is not None:
      return False
    shutil.rmtree(self.workdir, ignore_errors=True)
    return not os.path.exists(self.workdir)


def _read_lock(path: str) -> dict[str, Any] | None:
  """The holder recorded in a lock file, or None when it is missing, unreadable or torn."""
  try:
    with open(path, encoding="utf-8") as f:
      holder = json.load(f)
  except (OSError, ValueError):
    return None
  ok = isinstance(holder, dict) and isinstance(holder.get("pid"), int)
  return holder if ok else None


def _locked_error(path: str, workdir: str, holder: dict[str, Any] | None):
  """The one-line error of a workdir in use by ``holder`` (None: not yet written)."""
  who = (f"pid {holder['pid']} on host {holder.get('host')!r}" if holder
         else "a process that is writing it now")
  return errors.WorkdirLockedError(
      f"{path}: workdir {workdir!r} is in use by {who}. Wait for that run to end or use "
      "another --workdir; if that run is gone, delete the lock file.")


def acquire_lock(workdir: str) -> filelock.BaseFileLock:
  """Takes ``workdir/run.lock`` with ``filelock.FileLock`` (``flock``: freed when its process
  dies) and writes ``{"pid", "host", "time"}`` (JSON) into it; returns the lock. A lock whose
  holder is gone is taken over with a warning; one naming another host never is (``flock``
  does not reach across every shared filesystem).

  Raises:
    errors.WorkdirLockedError: naming the holder's pid and host, when it may still be running.
    errors.WriteError: the lock could not be written (a full disk); no lock file is left.
  """
  path = os.path.join(workdir, LOCK_FILE)
  release_lock(_HELD.pop(path, None))
  holder = _read_lock(path)
  if holder is not None and holder.get("host") != socket.gethostname():
    raise _locked_error(path, workdir, holder)
  lock = filelock.FileLock(path, timeout=0)
  try:
    lock.acquire()
  except filelock.Timeout:
    raise _locked_error(path, workdir, _read_lock(path)) from None
  except OSError as e:
    raise atomic_io.write_error(path, e, "nothing of the run was written") from e
  if holder is None and os.path.getsize(path):
    errors.warn(f"{path}: replacing a stale lock (it is unreadable)")
  elif holder is not None and holder["pid"] != os.getpid():
    errors.warn(f"{path}: replacing a stale lock (process {holder['pid']} no longer holds it)")
  try:
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_TRUNC), "w") as f:
      json.dump({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}, f)
  except OSError as e:   # a full disk: leave no lock file that would block the rerun
    release_lock(lock)
    raise atomic_io.write_error(path, e, "nothing of the run was written") from e
  _HELD[path] = lock
  return lock


def release_lock(lock: filelock.BaseFileLock | None) -> None:
  """Removes the file of ``lock`` (from :func:`acquire_lock`) and releases it; None: no-op.
  A file that cannot be removed (the folder lost its write permission) is warned about, not
  raised: the lock is released all the same, so the error that ended the run stays the one
  reported, and the next run replaces the file (:func:`acquire_lock`)."""
  if lock is None or not lock.is_locked:
    return
  _HELD.pop(lock.lock_file, None)
  try:
    os.remove(lock.lock_file)
  except FileNotFoundError:
    pass
  except OSError as e:
    errors.warn(f"{lock.lock_file}: could not remove the lock file: {e.strerror or e}; the "
                "lock is released anyway, and the next run replaces the file")
  lock.release()
