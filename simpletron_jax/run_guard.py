"""Guards that keep a training run from failing silently (issue 14, "Nothing silent").

* :class:`RunError` and its subclasses: a run that stops for a named cause. ``train.py``
  prints their message and exits with status 1, without a traceback.
* The workdir lock (:func:`acquire_lock`): one ``train.py`` per workdir.
* Finiteness checks (:func:`tree_is_finite`, :func:`first_nonfinite`) and a CRC of a state
  (:func:`state_crc32`) that checkpoints carry, so a damaged checkpoint is never restored.
* Start-up checks of the data splits and of settings that would make a run meaningless or
  unresumable (:func:`check_splits`, :func:`check_settings`).
* The run lineage (:func:`lineage_id`): a random id shared by every checkpoint of one run,
  so ``best/`` can be matched to ``checkpoints/``.
* :func:`json_safe`: non-finite floats become ``null``, so every JSON file stays valid.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import time
import uuid
import warnings
import zlib
from typing import Any, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

LOCK_FILE = "run.lock"
RUN_ID_FILE = "run_id"
# A lock file that cannot be parsed and is older than this is left by a killed writer.
TORN_LOCK_SECONDS = 10.0


class RunError(RuntimeError):
  """A run stopped for a cause its message names; ``train.py`` exits 1 with the message."""


class NonFiniteError(RunError):
  """A loss, gradient norm or parameter became NaN or infinite."""


class CheckpointError(RunError):
  """A checkpoint could not be saved, or no intact checkpoint could be restored."""


class ConfigMismatchError(RunError):
  """The config differs from the one a checkpoint was saved with."""


class WorkdirLockedError(RunError):
  """Another run holds the workdir's lock file."""


class RunWarning(UserWarning):
  """Something was repaired or ignored at start-up (a stale lock, a bad checkpoint)."""


def warn(message: str) -> None:
  """Emits ``message`` as a :class:`RunWarning` (shown on stderr by default)."""
  warnings.warn(message, RunWarning, stacklevel=2)


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
  replaced, with a :class:`RunWarning`. On a multi-host job only process 0 should call this.

  Args:
    workdir: the run directory; must exist.

  Returns:
    The lock file's path, for :func:`release_lock`.

  Raises:
    WorkdirLockedError: naming the holder's pid and host, when it may still be running.
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
        raise WorkdirLockedError(
            f"{path}: workdir {workdir!r} is in use by {who}. Wait for that run to end or "
            "use another --workdir; if that run is gone, delete the lock file.") from None
      if holder is None or holder["pid"] != os.getpid():
        warn(f"{path}: replacing a stale lock ({reason})")
      try:
        os.remove(path)
      except FileNotFoundError:
        pass
      continue
    with os.fdopen(fd, "w") as f:
      json.dump(me, f)
    return path
  raise WorkdirLockedError(f"{path}: could not take the lock; another process keeps taking it")


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


def state_crc32(tree: Any) -> int:
  """CRC-32 of every leaf's shape, dtype and bytes, in tree order (host copies)."""
  crc = 0
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


def json_safe(obj: Any) -> Any:
  """``obj`` with every non-finite float replaced by None (JSON ``null``), recursively."""
  if isinstance(obj, Mapping):
    return {k: json_safe(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [json_safe(v) for v in obj]
  if isinstance(obj, (float, np.floating)) and not math.isfinite(obj):
    return None
  return obj


def flat_diff(saved: Mapping[str, Any], current: Mapping[str, Any],
              prefix: str = "model") -> list[str]:
  """``"field: saved A, now B"`` for every field where two nested dicts differ."""
  out = []
  for key in sorted(set(saved) | set(current)):
    a, b = saved.get(key, "<absent>"), current.get(key, "<absent>")
    if isinstance(a, Mapping) and isinstance(b, Mapping):
      out += flat_diff(a, b, f"{prefix}.{key}")
    elif a != b:
      out.append(f"{prefix}.{key}: checkpoint {a!r}, config {b!r}")
  return out


# ----------------------------------------------------------------------------
# Start-up checks.


def check_splits(data: Any, config: Any) -> None:
  """Every split the run reads must hold examples.

  Args:
    data: a :class:`simpletron_jax.tasks.TaskData`.
    config: the run config (``batch_size``, ``grad_accum_steps``, ``data.data_dir``).

  Raises:
    ValueError: naming the empty split, the data source and ``data.data_dir``.
  """
  micro = config.batch_size // config.grad_accum_steps
  where = (f"data source {data.source!r} (config field "
           f"data.data_dir={config.data.get('data_dir')!r})")
  for name in ("train", "val", "test"):
    if len(getattr(data, name)) == 0:
      raise ValueError(f"the {name} split is empty; {where}")
  if len(data.train) < micro:
    raise ValueError(f"the train split has {len(data.train)} examples, fewer than one "
                     f"micro-batch of {micro} (config fields batch_size, grad_accum_steps); "
                     f"{where}")


def check_settings(config: Any) -> None:
  """Refuses settings that make a run meaningless or unresumable; warns about doubtful ones.

  Raises:
    ValueError: naming the field: ``learning_rate`` not a positive finite number,
      ``max_to_keep < 1`` (nothing to resume from), ``max_train_minutes < 0``.

  Warns (:class:`RunWarning`): ``warmup`` longer than ``num_train_steps`` with a warmup
  schedule (the peak rate is never reached); ``checkpoint_every`` above ``num_train_steps``
  (a killed run restarts from step 0).
  """
  lr = float(config.learning_rate)
  if not (math.isfinite(lr) and lr > 0):
    raise ValueError(f"learning_rate={config.learning_rate} must be a positive finite number")
  if int(config.max_to_keep) < 1:
    raise ValueError(f"max_to_keep={config.max_to_keep} must be >= 1, or a killed run "
                     "cannot resume")
  if float(config.get("max_train_minutes", 0) or 0) < 0:
    raise ValueError(f"max_train_minutes={config.max_train_minutes} must be >= 0 (0: no limit)")
  if "warmup" in str(config.get("factors", "")) and config.warmup > config.num_train_steps:
    warn(f"warmup={config.warmup} exceeds num_train_steps={config.num_train_steps}: the "
         f"learning rate never reaches learning_rate={config.learning_rate}")
  if config.checkpoint_every > config.num_train_steps:
    warn(f"checkpoint_every={config.checkpoint_every} exceeds num_train_steps="
         f"{config.num_train_steps}: only the final step is saved, so a killed run "
         "restarts from step 0")


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
    with open(path + ".tmp", "w") as f:
      f.write(run_id + "\n")
    os.replace(path + ".tmp", path)
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
