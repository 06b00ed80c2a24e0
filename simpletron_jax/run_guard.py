"""Guards that keep a training run from failing silently (issue 14, "Nothing silent").

* :class:`RunError` and its subclasses: a run that stops for a named cause. ``train.py``
  prints their message and exits with status 1, without a traceback.
* The workdir lock (:func:`acquire_lock`): one ``train.py`` per workdir.
* Finiteness checks (:func:`tree_is_finite`, :func:`first_nonfinite`) and a CRC of a state
  (:func:`state_crc32`) that checkpoints carry, so a damaged checkpoint is never restored.
* Start-up checks of the data splits and of settings that would make a run meaningless or
  unresumable (:func:`check_splits`, :func:`check_settings`, :func:`check_range`).
* No silent resume (issue 27): the :func:`run_record` a checkpoint carries (config, data
  digest, vocabulary and class count, device and host counts), :func:`check_resume` against
  it (only :data:`RESUME_ALLOWED_FIELDS` may change), and :func:`config_fingerprint`.
* The run lineage (:func:`lineage_id`): a random id shared by every checkpoint of one run,
  so ``best/`` can be matched to ``checkpoints/``.
* :func:`json_safe`: non-finite floats become ``null``, so every JSON file stays valid.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import socket
import threading
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
    WriteError: the lock could not be written (a full disk); no lock file is left.
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
    try:
      with os.fdopen(fd, "w") as f:
        json.dump(me, f)
    except OSError as e:   # a full disk: leave no empty lock that would block the rerun
      try:
        os.remove(path)
      except OSError:
        pass
      raise write_error(path, e, "nothing of the run was written") from e
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


class WriteError(RunError):
  """A file of the run could not be written (a full disk, a read-only folder); the message
  names the file and the OS error."""


def write_text_atomic(path: str, text: str) -> None:
  """Writes ``text`` to ``path`` so that ``path`` is either the old file or the whole new one.

  The text goes to ``path + ".tmp"``, is flushed and fsynced, then renamed over ``path``
  (``os.replace``, atomic on POSIX). A failed write (``ENOSPC``, ``EROFS``, ``EACCES``) removes
  the temporary file and leaves ``path`` as it was.

  Args:
    path: the file to write; its folder must exist.
    text: the whole contents (UTF-8).

  Raises:
    WriteError: naming ``path`` and the OS error, when any step fails.
  """
  tmp = path + ".tmp"
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except OSError as e:
    try:
      os.remove(tmp)
    except OSError:
      pass
    raise WriteError(f"could not write {path}: {e.strerror or e} (errno {e.errno}); the "
                     "previous file, if any, is unchanged. Free space or fix the folder's "
                     "permissions, then rerun the same command to continue.") from e


def write_json_atomic(path: str, obj: Any, indent: int | None = 2) -> None:
  """:func:`write_text_atomic` of ``obj`` as strict JSON (non-finite floats become ``null``,
  see :func:`json_safe`).

  Raises:
    WriteError: as :func:`write_text_atomic`.
    TypeError: if ``obj`` holds a value JSON cannot encode.
  """
  write_text_atomic(path, json.dumps(json_safe(obj), indent=indent, allow_nan=False) + "\n")


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


def check_range(field: str, value: Any, *, low: float | None = None, high: float | None = None,
                high_open: bool = False, integer: bool = False, hint: str = "") -> None:
  """Refuses a config value that is not a finite number in ``[low, high]`` (``[low, high)``
  with ``high_open``), or not an int when ``integer``.

  Args:
    field: the dotted config field, for the message (``model.dropout_rate``).
    value: its value.
    low, high: the bounds (None: unbounded on that side).
    high_open: exclude ``high``.
    integer: require an int (a bool is not one).
    hint: appended to the message (what the value means).

  Raises:
    ValueError: one line, ``"<field>=<value> must be ..."``.
  """
  kind = "an int" if integer else "a number"
  number = (isinstance(value, (int, np.integer)) if integer
            else isinstance(value, (int, float, np.integer, np.floating)))
  if isinstance(value, (bool, np.bool_)) or not number or not math.isfinite(float(value)):
    raise ValueError(f"{field}={value!r} must be {kind}{hint}")
  too_low = low is not None and value < low
  too_high = high is not None and (value >= high if high_open else value > high)
  if too_low or too_high:
    if high is None:
      wanted = f">= {low:g}"
    elif low is None:
      wanted = f"{'<' if high_open else '<='} {high:g}"
    else:
      wanted = f"in [{low:g}, {high:g}{')' if high_open else ']'}"
    raise ValueError(f"{field}={value!r} must be {wanted}{hint}")


def check_settings(config: Any) -> None:
  """Refuses settings that make a run meaningless or unresumable; warns about doubtful ones.

  Covers the optimizer, the schedule and the run's bookkeeping; the model, data and batch
  fields are checked by :func:`simpletron_jax.train_lib.validate_config`. Both run before any
  work (data, compilation, checkpoints).

  Raises:
    ValueError: one line naming the field and its value: ``learning_rate`` not a positive
      finite number; ``weight_decay``, ``grad_clip_norm`` or ``adam_eps`` negative;
      ``adam_b1``/``adam_b2`` or ``label_smoothing`` (if present) outside [0, 1); ``warmup``
      not an int >= 0; an unknown name in ``factors`` (with the known ones) or ``warmup``
      0 for a warmup factor (:func:`simpletron_jax.schedules.create_learning_rate_schedule`);
      ``max_to_keep < 1`` (nothing to resume from); ``max_train_minutes < 0``.

  Warns (:class:`RunWarning`): ``warmup`` longer than ``num_train_steps`` with a warmup
  schedule (the peak rate is never reached); ``checkpoint_every`` above ``num_train_steps``
  (a killed run restarts from step 0).
  """
  from simpletron_jax import schedules  # pylint: disable=import-outside-toplevel
  lr = config.learning_rate
  if (isinstance(lr, bool) or not isinstance(lr, (int, float, np.integer, np.floating))
      or not (math.isfinite(float(lr)) and lr > 0)):
    raise ValueError(f"learning_rate={config.learning_rate} must be a positive finite number")
  check_range("weight_decay", config.weight_decay, low=0,
              hint=" (AdamW's decoupled decay; 0: none)")
  check_range("grad_clip_norm", config.get("grad_clip_norm", 0.0), low=0, hint=" (0: none)")
  for field in ("adam_b1", "adam_b2"):
    check_range(field, config[field], low=0, high=1, high_open=True)
  check_range("adam_eps", config.adam_eps, low=0)
  if "label_smoothing" in config:
    check_range("label_smoothing", config.label_smoothing, low=0, high=1, high_open=True)
  check_range("warmup", config.warmup, low=0, integer=True, hint=" (optimizer steps)")
  schedules.create_learning_rate_schedule(factors=config.factors, warmup_steps=config.warmup)
  check_range("max_to_keep", config.max_to_keep, integer=True)
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
# Resume: what a checkpoint was computed with (issue 27).

# Config fields that a resumed run may change: they change what is reported or when, not the
# parameters a step computes. The data paths may move; the data themselves are compared
# (the ``data_sha256`` of :func:`run_record`). ``num_train_steps`` only upward, and only when
# the schedule does not depend on it (a factor in SCHEDULE_LENGTH_FACTORS). Every other field
# (seed, task, data.*, the optimizer and schedule, batch_size, grad_accum_steps, model.*, the
# evaluation sizes num_eval_steps / num_test_steps / eval_batch_size, weight surgery) and the
# device and host counts are refused unless train.py gets --allow_resume_changes.
RESUME_ALLOWED_FIELDS = ("eval_frequency", "num_train_steps", "max_train_minutes", "log_every",
                         "checkpoint_every", "max_to_keep", "data.data_dir", "data.cache_dir",
                         "data.tfds_data_dir")
# Learning-rate factors whose rate depends on num_train_steps (their period).
SCHEDULE_LENGTH_FACTORS = ("cosine_decay",)
# The checkpoint meta key holding :func:`run_record`, and config.json's list of changes.
RECORD_KEY = "run_record"
CONFIG_HISTORY_KEY = "config_history"
# What each non-config entry of a run record is, for the messages.
RECORD_LABELS = {
    "vocab_size": "vocab_size (of the task's data: the embedding's rows)",
    "num_classes": "num_classes (of the task's data: the output layer's width)",
    "num_devices": "number of devices (jax.device_count(): the data and dropout layout)",
    "num_hosts": "number of hosts (jax.process_count())",
    "data_sha256": "data (sha256 of the loaded splits)",
}


def flatten_config(config: Any) -> dict[str, Any]:
  """``{"model.emb_dim": 64, ...}``: every leaf of a config as plain JSON values.

  Args:
    config: an ``ml_collections.ConfigDict`` (references resolved) or a nested dict as read
      from ``config.json``; tuples become lists either way. A ``config_history`` key is left
      out.
  """
  if hasattr(config, "to_json_best_effort"):
    config = json.loads(config.to_json_best_effort())
  out: dict[str, Any] = {}

  def walk(node, prefix):
    for key, value in node.items():
      if not prefix and key == CONFIG_HISTORY_KEY:
        continue
      name = f"{prefix}{key}"
      if isinstance(value, Mapping) and value:
        walk(value, name + ".")
      else:
        out[name] = json.loads(json.dumps(value, default=str))
  walk(config, "")
  return out


def _schedule_uses_length(flat: Mapping[str, Any]) -> bool:
  return any(f in str(flat.get("factors", "")) for f in SCHEDULE_LENGTH_FACTORS)


def computed_fields(config: Any) -> dict[str, Any]:
  """The fields of ``config`` that change what is computed: every leaf of
  :func:`flatten_config` but :data:`RESUME_ALLOWED_FIELDS` (``num_train_steps`` stays when
  the schedule depends on it)."""
  flat = flatten_config(config)
  keep_length = _schedule_uses_length(flat)
  return {k: v for k, v in flat.items()
          if k not in RESUME_ALLOWED_FIELDS or (k == "num_train_steps" and keep_length)}


def config_fingerprint(config: Any) -> str:
  """SHA-256 (64 hex digits) of the canonical JSON (sorted keys, no spaces) of
  :func:`computed_fields`: two configs share it exactly when they compute the same run,
  whatever their reporting settings (:data:`RESUME_ALLOWED_FIELDS`) and data paths."""
  text = json.dumps(computed_fields(config), sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(text.encode()).hexdigest()


def run_record(config: Any, *, vocab_size: int, num_classes: int, num_devices: int,
               num_hosts: int, data_sha256: str | None = None) -> dict[str, Any]:
  """What a checkpoint's numbers depend on, stored in its meta under :data:`RECORD_KEY`.

  Args:
    config: the run config.
    vocab_size, num_classes: the task data's sizes (the model's embedding and output).
    num_devices, num_hosts: ``jax.device_count()`` and ``jax.process_count()``.
    data_sha256: a digest of the loaded splits
      (:func:`simpletron_jax.distributed.data_fingerprint`); None: not compared.

  Returns:
    A JSON-ready dict: ``config`` (nested, as ``config.json``) and the other arguments.
  """
  tree = (json.loads(config.to_json_best_effort()) if hasattr(config, "to_json_best_effort")
          else dict(config))
  tree.pop(CONFIG_HISTORY_KEY, None)
  return {"config": tree, "vocab_size": int(vocab_size), "num_classes": int(num_classes),
          "num_devices": int(num_devices), "num_hosts": int(num_hosts),
          "data_sha256": data_sha256}


def resume_changes(saved: Mapping[str, Any], current: Mapping[str, Any],
                   skip_prefixes: tuple[str, ...] = ("model.",)) -> list[dict[str, Any]]:
  """Every difference between two :func:`run_record`\\ s, in field order.

  Args:
    saved: the record of the checkpoint (may lack entries: an older checkpoint, or only a
      ``config`` read from ``config.json``; what is missing is not compared).
    current: the record of this start.
    skip_prefixes: config fields compared elsewhere (``model.*``: by the checkpoint's
      ``model_config``, with the defaults of options added since).

  Returns:
    ``[{"field", "old", "new", "allowed"}]``, the record's own entries (sizes, devices,
    data) first, then the config fields in name order; ``allowed`` is True for the
    :data:`RESUME_ALLOWED_FIELDS` (``num_train_steps`` only upward and when the schedule
    does not depend on it).
  """
  changes = []
  for key in RECORD_LABELS:
    old, new = saved.get(key), current.get(key)
    if old is not None and new is not None and old != new:
      changes.append({"field": key, "old": old, "new": new, "allowed": False})
  old_cfg = flatten_config(saved.get("config") or {})
  new_cfg = flatten_config(current.get("config") or {})
  if old_cfg:
    length_matters = _schedule_uses_length(old_cfg) or _schedule_uses_length(new_cfg)
    for field in sorted(set(old_cfg) | set(new_cfg)):
      if field.startswith(skip_prefixes):
        continue
      old, new = old_cfg.get(field, "<absent>"), new_cfg.get(field, "<absent>")
      if old == new:
        continue
      allowed = field in RESUME_ALLOWED_FIELDS
      if field == "num_train_steps":
        allowed = (not length_matters and isinstance(old, int) and isinstance(new, int)
                   and new >= old)
      changes.append({"field": field, "old": old, "new": new, "allowed": allowed})
  return changes


def describe_change(change: Mapping[str, Any]) -> str:
  """``"<field>: checkpoint A, config B"`` (with what a record entry is)."""
  name = RECORD_LABELS.get(change["field"], change["field"])
  old, new = change["old"], change["new"]
  if change["field"] == "data_sha256":
    old, new = str(old)[:12], str(new)[:12]
  elif change["field"] == "num_train_steps" and not change["allowed"]:
    name += " (only upward, and not with a cosine_decay schedule, whose period it is)"
  return f"{name}: checkpoint {old!r}, config {new!r}"


def check_resume(where: str, saved: Mapping[str, Any] | None, current: Mapping[str, Any], *,
                 model_diff: Iterable[str] = (), allow_changes: bool = False
                 ) -> list[dict[str, Any]]:
  """Refuses to resume the checkpoint at ``where`` with settings that compute something else.

  Args:
    where: the checkpoint folder, for the message.
    saved: the checkpoint's :func:`run_record` (None: it predates records; nothing but
      ``model_diff`` is checked).
    current: this start's record.
    model_diff: the ``model.*`` differences (:func:`flat_diff` lines); never allowed.
    allow_changes: train.py's ``--allow_resume_changes``: continue despite the other changes.

  Returns:
    Every change (:func:`resume_changes`), allowed or forced, for the config history.

  Raises:
    ConfigMismatchError: one line listing each refused field with both values, and what
      to do.
  """
  model_diff = list(model_diff)
  changes = resume_changes(saved or {}, current)
  refused = [c for c in changes if not c["allowed"]]
  if model_diff or (refused and not allow_changes):
    listed = "; ".join([describe_change(c) for c in refused] + model_diff)
    todo = ("Resume with the checkpoint's values (the workdir's config.json) or use another "
            "--workdir")
    if refused:
      todo += ("; or pass --allow_resume_changes to continue with the new values (recorded in "
               f"config.json's {CONFIG_HISTORY_KEY})")
    if model_diff:
      todo += "; model.* fields cannot change on resume"
    raise ConfigMismatchError(f"{where} was computed with other settings: {listed}. {todo}.")
  return changes


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
    write_text_atomic(path, run_id + "\n")
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


# ----------------------------------------------------------------------------
# Failed writes, preemption and results.json (issue 27).


def write_error(path: str, error: OSError, kept: str = "what was written before is kept"
                ) -> WriteError:
  """The one-line :class:`WriteError` for a failed write of ``path`` (not raised).

  Args:
    path: the file that could not be written.
    error: the ``OSError`` (``ENOSPC``, ``EROFS``, ``EACCES``, ``EIO``...).
    kept: what the reader can still rely on, for the message.
  """
  return WriteError(f"could not write {path}: {error.strerror or error} (errno {error.errno}); "
                    f"{kept}. Free space or fix the folder's permissions, then rerun the same "
                    "command to continue.")


PREEMPTED_EXIT_CODE = 75
"""``train.py``'s exit status after a preemption (:class:`PreemptedError`): ``EX_TEMPFAIL`` of
``sysexits.h``, "a temporary failure ... the user is invited to retry". Every other
:class:`RunError` exits 1."""


class PreemptedError(RunError):
  """The run stopped on SIGTERM or SIGINT after saving a checkpoint of ``step``; rerunning
  the same command continues it. ``train.py`` exits with :data:`PREEMPTED_EXIT_CODE`.

  Attributes:
    step: the optimizer step saved.
    cause: what stopped it (``"SIGTERM"``, ``"SIGINT"``, ``"a preemption notice"``).
  """

  def __init__(self, step: int, cause: str):
    super().__init__(f"preempted at step {step}; rerun the same command to continue")
    self.step, self.cause = int(step), cause


class PreemptionGuard:
  """Turns SIGTERM (what a preemptible VM or a cluster scheduler sends) and SIGINT (Ctrl-C)
  into a request to stop after the current training step.

  Enter it around a training loop and call :meth:`should_stop` once after every step, on
  every host, with that step; when it returns True, save and stop. How the hosts agree:

  * one process (``jax.process_count() == 1``): Python handlers for both signals set a
    flag, which :meth:`should_stop` returns;
  * several processes with JAX's preemption service (``jax.distributed`` with
    ``jax_enable_preemption_service``, the default): ``jax.distributed.initialize``
    installed the service's own SIGTERM handler, which tells every host; it is left in place,
    and SIGINT is forwarded to it as a SIGTERM. :meth:`should_stop` is
    ``multihost_utils.reached_preemption_sync_point(step)``: True on every host at the same
    step, one past the largest step any host had reached when the notice spread; no
    collective per step;
  * several processes without that service: Python handlers, and :meth:`should_stop` ORs
    the flags of all hosts (one small collective per step).

  A second signal while a stop is pending restores the previous handlers and passes the
  signal on (a second Ctrl-C raises ``KeyboardInterrupt``; a second SIGTERM with the default
  handler ends the process). Python installs handlers only from the main thread; in other
  threads none is installed (the hosts still agree). Leaving the ``with`` block (or
  :meth:`restore`) puts the previous handlers back.

  Attributes:
    signal_name: the first signal received through this guard's handlers, or None.
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.signal_name: str | None = None
    self.mode = "off"
    self._previous: dict[int, Any] = {}

  def __enter__(self) -> "PreemptionGuard":
    return self.install()

  def __exit__(self, *exc_info) -> None:
    self.restore()

  def install(self) -> "PreemptionGuard":
    """Installs the handlers (what entering the ``with`` block does); returns the guard.

    The mode depends only on the host count and JAX's config, so every host picks the same.
    """
    handled = self.SIGNALS
    if jax.process_count() == 1:
      self.mode = "local"
    elif getattr(jax.config, "jax_enable_preemption_service", False):
      self.mode, handled = "jax", (signal.SIGINT,)
    else:
      self.mode = "any_host"
    if self._previous or threading.current_thread() is not threading.main_thread():
      return self
    for signum in handled:
      self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def restore(self) -> None:
    """Puts back the handlers found on entry (idempotent)."""
    previous, self._previous = self._previous, {}
    for signum, handler in previous.items():
      signal.signal(signum, signal.SIG_DFL if handler is None else handler)

  def _handle(self, signum: int, frame) -> None:
    name = signal.Signals(signum).name
    if self.signal_name is not None:   # the second one: stop at once
      handler = self._previous.get(signum)
      self.restore()
      os.write(2, f"\n{name} again: stopping at once, without saving\n".encode())
      if callable(handler):
        handler(signum, frame)
      elif handler in (None, signal.SIG_DFL):
        signal.raise_signal(signum)
      return
    self.signal_name = name
    os.write(2, f"\n{name} received: stopping after the current step and saving a checkpoint "
                f"(send it again to stop at once, without saving)\n".encode())
    if self.mode == "jax":
      os.kill(os.getpid(), signal.SIGTERM)   # to JAX's preemption notifier

  def should_stop(self, step: int) -> bool:
    """Whether to save and stop after optimizer ``step``; the same answer on every host.

    A collective call on several hosts: every host calls it after every step.
    """
    if self.mode == "jax":
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      return bool(multihost_utils.reached_preemption_sync_point(int(step)))
    if self.mode == "any_host":
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      flags = multihost_utils.process_allgather(np.int32(self.signal_name is not None))
      return bool(np.any(np.asarray(flags)))
    return self.signal_name is not None

  def requested_locally(self) -> bool:
    """A signal arrived on this single-process run (after its last :meth:`should_stop`, for
    example); always False on several hosts, which must agree through :meth:`should_stop`."""
    return self.mode == "local" and self.signal_name is not None

  @property
  def cause(self) -> str:
    """The signal's name, or ``"a preemption notice"`` (SIGTERM through JAX's service)."""
    return self.signal_name or "a preemption notice"


RESULTS_ACCURACY_KEYS = ("test_accuracy", "test_accuracy_best_val", "test_accuracy_final")


def results_problem(results: Any, config: Any = None) -> str | None:
  """Why a ``results.json`` does not count as a finished run (of ``config``); None if it does.

  ``train_lib.train_and_evaluate`` writes ``complete``, ``final_step`` and
  ``config_fingerprint`` (:func:`config_fingerprint`); files written before those keys
  existed count when their ``last_step`` reached ``num_train_steps`` (or records neither).

  Args:
    results: the parsed ``results.json``.
    config: the config the run should have (a ConfigDict or ``config.json``'s dict); None:
      only completeness and finiteness are checked.

  Returns:
    One line: incomplete (with the step and why), a missing or non-finite test accuracy
    (NaN is stored as ``null``), another step count, or another config fingerprint.
  """
  if not isinstance(results, Mapping):
    return "it is not a JSON object"
  step = results.get("final_step", results.get("last_step"))
  total = results.get("num_train_steps")
  complete = results.get("complete")
  if complete is None and isinstance(step, int) and isinstance(total, int):
    complete = step >= total
  if complete is False:
    why = results.get("stopped_by")
    return (f"incomplete: training stopped at step {step} of {total}"
            + (f" ({why})" if why else "") + "; rerun the same command to continue")
  if not any(k in results for k in RESULTS_ACCURACY_KEYS):
    return "it holds no test accuracy"
  for key in RESULTS_ACCURACY_KEYS:
    value = results.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
      return f"{key} is {'null (NaN or inf)' if value is None else repr(value)}"
  if config is not None:
    wanted = config.get("num_train_steps")
    if isinstance(step, int) and isinstance(wanted, int) and step != wanted:
      return f"it was computed at step {step}, but the config trains {wanted} steps"
    saved = results.get("config_fingerprint")
    if saved is not None and saved != config_fingerprint(config):
      return (f"it was computed with another config (config_fingerprint {str(saved)[:12]}, "
              f"this config's {config_fingerprint(config)[:12]})")
  return None
