"""Guards that keep a training run from failing silently.

* The workdir lock (:func:`acquire_lock`): one ``train.py`` per workdir.
* Finiteness checks (:func:`tree_is_finite`, :func:`first_nonfinite`) and a CRC and layout of a
  state (:func:`state_crc32`, :func:`state_structure`) that checkpoints carry, so a damaged
  checkpoint is never restored.
* The run lineage (:func:`lineage_id`): a random id shared by every checkpoint of one run,
  so ``best/`` can be matched to ``checkpoints/``.

The other guards have a module each: the errors a run stops with
(:mod:`simpletron_jax.runtime.errors`), atomic writes (:mod:`simpletron_jax.runtime.atomic_io`),
SIGTERM handling (:mod:`simpletron_jax.train.preemption`) and what a run was computed with
(:mod:`simpletron_jax.train.run_record`). The start-up checks of the config are in
:mod:`simpletron_jax.train.config_checks`.
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

import jax
import jax.numpy as jnp
import numpy as np

from simpletron_jax.runtime import atomic_io, errors

LOCK_FILE = "run.lock"
RUN_ID_FILE = "run_id"
# A lock file that cannot be parsed and is older than this is left by a killed writer.
TORN_LOCK_SECONDS = 10.0


# ----------------------------------------------------------------------------
# The workdir lock.


def _read_lock(path: str) -> dict[str, Any] | None:
  """The holder recorded in a lock file, or None when it is unreadable or torn."""
  try:
    with open(path) as f:
      holder = json.load(f)
  except (OSError, ValueError):
    return None
  ok = isinstance(holder, dict) and isinstance(holder.get("pid"), int)
  return holder if ok else None


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # alive, owned by another user
    return True
  return True


def _stale_reason(path: str, holder: dict[str, Any] | None) -> str | None:
  """Why the lock at ``path`` can be taken over, or None when its holder may be running."""
  if holder is None:
    try:
      age = time.time() - os.path.getmtime(path)
    except FileNotFoundError:
      return "it disappeared"
    return f"it is unreadable and {age:.0f} s old" if age > TORN_LOCK_SECONDS else None
  if holder.get("host") != socket.gethostname():
    return None  # cannot check a process on another host
  if holder["pid"] == os.getpid():
    return "this process took it in an earlier call that did not finish"
  if not _pid_alive(holder["pid"]):
    return f"process {holder['pid']} no longer exists"
  return None


def acquire_lock(workdir: str) -> str:
  """Takes ``workdir/run.lock`` (``O_CREAT | O_EXCL``) holding ``{"pid", "host", "time"}``.

  A lock whose process is gone (same host, dead pid), that this process took in an earlier
  call, or that is unreadable and older than :data:`TORN_LOCK_SECONDS` is stale: it is
  replaced, with a :class:`errors.RunWarning`. On a multi-host job only process 0 should call
  this.

  Args:
    workdir: the run directory; must exist.

  Returns:
    The lock file's path, for :func:`release_lock`.

  Raises:
    errors.WorkdirLockedError: naming the holder's pid and host, when it may still be running.
    errors.WriteError: the lock could not be written (a full disk); no lock file is left.
  """
  path = os.path.join(workdir, LOCK_FILE)
  me = {"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}
  for _ in range(3):
    try:
      fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
      holder = _read_lock(path)
      reason = _stale_reason(path, holder)
      if reason is None:
        who = (f"pid {holder['pid']} on host {holder.get('host')!r}" if holder
               else "a process that is writing it now")
        raise errors.WorkdirLockedError(
            f"{path}: workdir {workdir!r} is in use by {who}. Wait for that run to end or "
            "use another --workdir; if that run is gone, delete the lock file.") from None
      if holder is None or holder["pid"] != os.getpid():
        errors.warn(f"{path}: replacing a stale lock ({reason})")
      try:
        os.remove(path)
      except FileNotFoundError:
        pass
      continue
    try:
      with os.fdopen(fd, "w") as f:
        json.dump(me, f)
    except OSError as e:   # a full disk: leave no empty lock that would block the rerun
      try:
        os.remove(path)
      except OSError:
        pass
      raise atomic_io.write_error(path, e, "nothing of the run was written") from e
    return path
  raise errors.WorkdirLockedError(
      f"{path}: could not take the lock; another process keeps taking it")


def release_lock(path: str | None) -> None:
  """Removes the lock at ``path`` if this process holds it (None: nothing to do)."""
  if path is None:
    return
  holder = _read_lock(path)
  if holder and holder["pid"] == os.getpid() and holder.get("host") == socket.gethostname():
    os.remove(path)


# ----------------------------------------------------------------------------
# Finiteness and integrity.


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


# ----------------------------------------------------------------------------
# Run lineage.


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
