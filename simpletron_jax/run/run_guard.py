"""Guards that keep a training run from failing silently (docs/faults.md).

* The workdir lock (:func:`acquire_lock`, ``filelock.FileLock``): one ``train.py`` per workdir.
* Finiteness checks, and a CRC and layout of a state that checkpoints carry, so a damaged
  checkpoint is never restored.
* The run lineage (:func:`lineage_id`): one random id shared by every checkpoint of a run.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
import uuid
import zlib
from typing import Any, Iterable, Mapping

import filelock
import jax
import jax.numpy as jnp
import numpy as np

from simpletron_jax.runtime import atomic_io, errors

LOCK_FILE = "run.lock"
RUN_ID_FILE = "run_id"
_HELD: dict[str, filelock.BaseFileLock] = {}   # lock path -> the lock this process holds


# ---------------------------------------------------------------- The workdir lock.


def _read_lock(path: str) -> dict[str, Any] | None:
  """The holder recorded in a lock file, or None when it is missing, unreadable or torn."""
  try:
    with open(path) as f:
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
  dies) and writes ``{"pid", "host", "time"}`` (JSON) into it; returns the lock.

  A lock whose holder is gone is taken over with a warning; one naming another host never is
  (``flock`` does not reach across every shared filesystem). Only process 0 calls this.

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
  """Removes the file of ``lock`` (from :func:`acquire_lock`) and releases it; None: no-op."""
  if lock is None or not lock.is_locked:
    return
  _HELD.pop(lock.lock_file, None)
  try:
    os.remove(lock.lock_file)
  except FileNotFoundError:
    pass
  lock.release()


# ---------------------------------------------------------------- Finiteness and integrity.


@jax.jit
def _all_finite(leaves):
  flags = [jnp.all(jnp.isfinite(x)) for x in leaves]
  return jnp.all(jnp.stack(flags)) if flags else jnp.asarray(True)


def tree_is_finite(tree: Any) -> bool:
  """True when every floating-point leaf of ``tree`` is finite (no NaN or inf)."""
  leaves = [x for x in jax.tree_util.tree_leaves(tree)
            if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
  return bool(_all_finite(leaves))


def first_nonfinite(records: Iterable[tuple[int, Mapping[str, Any]]],
                    keys: tuple[str, ...] = ("loss", "grad_norm")) -> tuple[int, dict] | None:
  """The first ``(step, {key: value})`` whose values are not all finite, else None.

  Args:
    records: ``(optimizer step, metrics)`` pairs in step order; metric values are scalars
      or arrays (every element is checked).
    keys: the metrics to check.
  """
  for step, metrics in records:
    values = {k: np.asarray(metrics[k]) for k in keys if k in metrics}
    if not all(np.all(np.isfinite(v)) for v in values.values()):
      return step, {k: float(v.reshape(-1)[0]) for k, v in values.items()}
  return None


def state_crc32(tree: Any, crc: int = 0) -> int:
  """CRC-32 of every leaf's shape, dtype and bytes, in tree order (host copies).

  ``crc``: the CRC of what comes before (``state_crc32((a, b)) == state_crc32(b,
  state_crc32(a))``), so one pass gives a part's CRC and the whole's."""
  for leaf in jax.tree_util.tree_leaves(jax.device_get(tree)):
    array = np.ascontiguousarray(np.asarray(leaf))
    crc = zlib.crc32(f"{array.shape}{array.dtype}".encode(), crc)
    crc = zlib.crc32(array.tobytes(), crc)
  return crc


def state_structure(tree: Any) -> str:
  """SHA-1 (hex) of every leaf's key path, shape and dtype, in tree order; no array data.

  Two train states share it exactly when a checkpoint of one can be restored into the
  other: the optimizer's wrappers (``grad_accum_steps > 1``, ``grad_clip_norm > 0``,
  ``freeze``, LoRA) each change it. Works on arrays and on ``jax.ShapeDtypeStruct``s.
  """
  digest = hashlib.sha1()
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if not hasattr(leaf, "dtype"):   # a Python scalar
      leaf = np.asarray(leaf)
    digest.update(f"{jax.tree_util.keystr(path)} {tuple(leaf.shape)} {np.dtype(leaf.dtype)}\n"
                  .encode())
  return digest.hexdigest()


# ---------------------------------------------------------------- Run lineage.


def lineage_id(workdir: str, resumed: str | None) -> str:
  """The run id of ``workdir``: ``resumed`` (from the checkpoint resumed) if given, else
  the one in ``workdir/run_id``, else a new random one. Written to ``workdir/run_id``.

  On a multi-host job every process gets process 0's id.

  Raises:
    ValueError: ``workdir/run_id`` is unreadable or, on several hosts, not 32 hex digits
      (names the file).
  """
  path = os.path.join(workdir, RUN_ID_FILE)
  run_id = resumed
  if run_id is None and os.path.exists(path):
    with open(path) as f:
      run_id = f.read().strip()
    if not run_id:
      raise ValueError(f"{path}: empty run id; delete the file to start a new run lineage")
  run_id = _from_process_0(run_id or uuid.uuid4().hex)
  if jax.process_index() == 0:
    atomic_io.write_text_atomic(path, run_id + "\n")
  return run_id


def _from_process_0(run_id: str) -> str:
  """``run_id`` as process 0 has it (a 32-hex-digit id; unchanged on one host)."""
  if jax.process_count() == 1:
    return run_id
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  try:
    words = np.frombuffer(bytes.fromhex(run_id), np.uint32)
  except ValueError:
    words = np.zeros(0, np.uint32)
  if words.size != 4:
    raise ValueError(f"{RUN_ID_FILE}: run id {run_id!r} is not 32 hex digits")
  return np.asarray(multihost_utils.broadcast_one_to_all(words), np.uint32).tobytes().hex()
