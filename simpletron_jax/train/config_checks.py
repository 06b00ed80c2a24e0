"""Every config field checked before any work, each refusal one line naming it.

``train.py`` (:func:`simpletron_jax.train.trainer.train_and_evaluate`) calls
:func:`validate_config` (task, model, data and batch fields) and :func:`check_settings` (the
optimizer, the schedule and the run's bookkeeping) before it loads data, compiles or touches a
checkpoint, and :func:`check_splits` once the data are loaded. :func:`check_range` is the
shared rule: a finite number, or an int, within bounds.
"""

from __future__ import annotations

import math
import re
from typing import Any

import ml_collections
import numpy as np

from simpletron_jax.data import batches, tasks
from simpletron_jax.model import attention, encoders
from simpletron_jax.runtime.errors import warn
from simpletron_jax.train import schedules, steps

# The largest position table a run may ask for: ``(model.max_length + 1) x model.emb_dim``
# float32 values. LRA's longest input, Path-X's 16384 tokens, needs 8 MiB at 128 features; a
# typo such as max_length=1000000000 would need 256 GB, and would fail deep in XLA with
# RESOURCE_EXHAUSTED instead of naming the field.
MAX_POSITION_TABLE_BYTES = 4 << 30
# Config fields that hold regexes of parameter paths (``re.search``), checked to compile.
REGEX_FIELDS = ("freeze", "init_include", "lora.targets")


def validate_config(config: ml_collections.ConfigDict, n_devices: int,
                    n_hosts: int = 1) -> None:
  """Checks every model, data and training field of ``config`` before any work.

  The optimizer, schedule and bookkeeping fields are checked by :func:`check_settings`;
  :func:`simpletron_jax.train.trainer.train_and_evaluate` calls both first.

  Args:
    config: the run config.
    n_devices: devices over all hosts (``jax.device_count()``).
    n_hosts: processes of a multi-host run (``jax.process_count()``), for the message.

  Warns:
    RunWarning: ``model.attention_kwargs`` holds options that the run's attention ignores
      (:func:`simpletron_jax.model.attention.inherited_options`).

  Raises:
    ValueError: one line naming the field and its value: an unknown ``task`` (with the
      known ones) or ``parallelism`` (not "pmap" or "jit"); ``seed`` or ``data.seed`` not
      an int >= 0; ``batch_size``, ``num_train_steps``, ``eval_frequency``,
      ``checkpoint_every``, ``log_every``,
      ``grad_accum_steps`` or a ``model`` size (``emb_dim``, ``qkv_dim``, ``mlp_dim``,
      ``num_heads``, ``num_layers``, ``max_length``) not a positive int; ``eval_batch_size``
      < 0, ``num_eval_steps`` or ``num_test_steps`` < -1 or 0; ``batch_size`` not divisible by
      ``grad_accum_steps`` times the global device count; ``model.dropout_rate``,
      ``model.attention_dropout_rate`` or a ``model.attention_kwargs.*dropout*`` rate
      outside [0, 1); ``data.bucket`` < 0, ``data.group_pool_batches`` < 1,
      ``data.val_fraction`` outside [0, 1); ``lora.rank`` or ``lora.alpha`` < 0; a position
      table of ``model.max_length + 1`` rows of ``model.emb_dim`` float32 values over
      :data:`MAX_POSITION_TABLE_BYTES`; or any
      ``model.*`` problem found by
      :meth:`simpletron_jax.model.encoders.ModelConfig.from_config_dict` (an unknown attention,
      pooling or dtype with the known ones, ``qkv_dim`` not divisible by ``num_heads``, ...).
  """
  tasks.get(config.task)   # an unknown task: the field and the known tasks
  if config.get("parallelism", "pmap") not in ("pmap", "jit"):
    raise ValueError(f"parallelism={config.parallelism!r} is not 'pmap' (LRA's) or 'jit' "
                     "(jax.jit over a device mesh; docs/scaling.md)")
  check = check_range
  check("seed", config.seed, low=0, integer=True)
  for field in ("batch_size", "num_train_steps", "eval_frequency", "checkpoint_every",
                "log_every", "grad_accum_steps"):
    check(field, config[field], low=1, integer=True)
  check("eval_batch_size", config.get("eval_batch_size", 0), low=0, integer=True,
        hint=" (0: the micro-batch size)")
  for field in ("num_eval_steps", "num_test_steps"):
    check(field, config.get(field, -1), low=-1, integer=True, hint=" (-1: the whole split)")
    if config.get(field, -1) == 0:
      raise ValueError(f"{field}=0 would evaluate no batch (0 is not a size here): set it to "
                       "-1 for the whole split, or to a number of batches >= 1")
  model = config.model
  for field in ("emb_dim", "qkv_dim", "mlp_dim", "num_heads", "num_layers", "max_length"):
    check(f"model.{field}", model[field], low=1, integer=True)
  check_position_table(model.max_length, model.emb_dim)
  for field in ("dropout_rate", "attention_dropout_rate"):
    check(f"model.{field}", model[field], low=0, high=1, high_open=True)
  for key, value in (model.get("attention_kwargs") or {}).items():
    if "dropout" in key and not isinstance(value, bool):
      check(f"model.attention_kwargs.{key}", value, low=0, high=1, high_open=True)
  data = config.data
  if "seed" in data:
    check("data.seed", data.seed, low=0, integer=True)
  check("data.bucket", data.get("bucket", 0), low=0, integer=True, hint=" (0: max_length)")
  check("data.group_pool_batches", data.get("group_pool_batches", 1), low=1, integer=True)
  if "val_fraction" in data:
    check("data.val_fraction", data.val_fraction, low=0, high=1, high_open=True)
  if "lora" in config:
    check("lora.rank", config.lora.get("rank", 0), low=0, integer=True, hint=" (0: no LoRA)")
    check("lora.alpha", config.lora.get("alpha", 0.0), low=0, hint=" (0: alpha = rank)")
  if model.qkv_dim % model.num_heads:
    divisors = [h for h in range(1, model.qkv_dim + 1) if model.qkv_dim % h == 0][:8]
    raise ValueError(f"model.qkv_dim={model.qkv_dim} is not divisible by model.num_heads="
                     f"{model.num_heads}: each head gets qkv_dim / num_heads features; set "
                     f"model.num_heads to a divisor of {model.qkv_dim} "
                     f"({', '.join(map(str, divisors))}, ...) or change model.qkv_dim")
  encoders.ModelConfig.from_config_dict(model)
  dropped = attention.inherited_options(model.attention, model.get("attention_kwargs") or {})
  if dropped:
    warn(f"model.attention_kwargs {dropped}: options of other attentions at their defaults, "
         f"left by a switch of model.attention; {model.attention!r} has no such options and "
         "ignores them")
  if config.batch_size % (config.grad_accum_steps * n_devices):
    hosts = (f" of all hosts ({n_hosts} host(s) x {n_devices // n_hosts} local device(s))"
             if n_hosts > 1 else "")
    raise ValueError(
        f"batch_size={config.batch_size} must be divisible by grad_accum_steps="
        f"{config.grad_accum_steps} times the {n_devices} device(s){hosts}: use a "
        f"multiple of {config.grad_accum_steps * n_devices}")


def check_splits(data: Any, config: Any) -> None:
  """Every split the run reads must hold examples.

  Args:
    data: a :class:`simpletron_jax.data.tasks.TaskData`.
    config: the run config (``batch_size``, ``grad_accum_steps``, ``data.data_dir``).

  Raises:
    ValueError: naming the empty split, the data source and ``data.data_dir``.
  """
  micro = batches.micro_batch_size(config)
  where = (f"data source {data.source!r} (config field "
           f"data.data_dir={config.data.get('data_dir')!r})")
  for name in ("train", "val", "test"):
    if len(getattr(data, name)) == 0:
      raise ValueError(f"the {name} split is empty; {where}")
  if len(data.train) < micro:
    raise ValueError(f"the train split has {len(data.train)} examples, fewer than one "
                     f"micro-batch of {micro} (config fields batch_size, grad_accum_steps); "
                     f"{where}")


def check_position_table(max_length: int, emb_dim: int,
                         limit: int = MAX_POSITION_TABLE_BYTES) -> None:
  """Refuses a ``model.max_length`` whose position table alone would not fit in memory.

  Args:
    max_length: ``model.max_length`` (tokens, CLS excluded; the table has one more row).
    emb_dim: ``model.emb_dim`` (the table's width).
    limit: the most bytes the float32 table may take (default
      :data:`MAX_POSITION_TABLE_BYTES`, 4 GiB).

  Raises:
    ValueError: one line naming ``model.max_length``, the table's size and the fix.
  """
  size = (int(max_length) + 1) * int(emb_dim) * 4
  if size > limit:
    raise ValueError(
        f"model.max_length={max_length} makes a position table of {int(max_length) + 1} x "
        f"{emb_dim} float32 values ({size / 2**30:.1f} GiB), over the {limit / 2**30:g} GiB "
        "limit: set model.max_length to the longest input the task has (the published: "
        f"{', '.join(f'{t} {tasks.get(t).max_length}' for t in tasks.names())})")


def check_regexes(config: Any) -> None:
  """Every regex of parameter paths in ``config`` (:data:`REGEX_FIELDS`) must compile.

  Raises:
    ValueError: one line naming the field, the pattern and Python's reason, e.g.
      ``freeze[0]='[': not a regular expression (unterminated character set at position 0)``.
  """
  for field in REGEX_FIELDS:
    section, _, name = field.rpartition(".")
    holder = config.get(section) if section else config
    patterns = holder.get(name, ()) if holder is not None else ()
    if isinstance(patterns, str):
      patterns = (patterns,)
    for i, pattern in enumerate(patterns or ()):
      if not isinstance(pattern, str):
        raise ValueError(f"{field}[{i}]={pattern!r} must be a string (a regex of parameter "
                         f"paths), e.g. --config.{field}=\"('^encoder/',)\"")
      try:
        re.compile(pattern)
      except re.error as e:
        raise ValueError(f"{field}[{i}]={pattern!r}: not a regular expression ({e}); escape "
                         "a literal bracket, dot or star with a backslash") from None


def check_range(field: str, value: Any, *, low: float | None = None, high: float | None = None,
                high_open: bool = False, integer: bool = False, hint: str = "",
                low_open: bool = False) -> None:
  """Refuses a config value that is not a finite number in ``[low, high]`` (``[low, high)``
  with ``high_open``, ``(low, ...`` with ``low_open``), or not an int when ``integer``.

  Args:
    field: the dotted config field, for the message (``model.dropout_rate``).
    value: its value.
    low, high: the bounds (None: unbounded on that side).
    high_open: exclude ``high``.
    low_open: exclude ``low``.
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
  too_low = low is not None and (value <= low if low_open else value < low)
  too_high = high is not None and (value >= high if high_open else value > high)
  if too_low or too_high:
    if high is None:
      wanted = f"{'>' if low_open else '>='} {low:g}"
    elif low is None:
      wanted = f"{'<' if high_open else '<='} {high:g}"
    else:
      wanted = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    raise ValueError(f"{field}={value!r} must be {wanted}{hint}")


def check_settings(config: Any) -> None:
  """Refuses settings that make a run meaningless or unresumable; warns about doubtful ones.

  Covers the optimizer, the schedule and the run's bookkeeping; the model, data and batch
  fields are checked by :func:`validate_config`. Both run before any work (data, compilation,
  checkpoints).

  Raises:
    ValueError: one line naming the field and its value: ``learning_rate`` not a positive
      finite number; ``weight_decay`` or ``grad_clip_norm`` negative; ``adam_eps`` not
      positive (Adam divides by ``sqrt(nu) + eps``: 0 gives NaN where a gradient is 0); a
      regex of ``freeze``, ``init_include`` or ``lora.targets`` that does not compile;
      ``adam_b1``/``adam_b2`` or ``label_smoothing`` (if present) outside [0, 1); ``warmup``
      not an int >= 0; an unknown name in ``factors`` (with the known ones) or ``warmup``
      0 for a warmup factor (:func:`simpletron_jax.train.schedules.create_learning_rate_schedule`);
      ``max_to_keep < 1`` (nothing to resume from); ``max_train_minutes < 0``; a
      ``best_metric`` that is not a validation metric, or ``best_mode`` not max or min.

  Warns (:class:`RunWarning`): ``warmup`` longer than ``num_train_steps`` with a warmup
  schedule (the peak rate is never reached); ``checkpoint_every`` above ``num_train_steps``
  (a killed run restarts from step 0).
  """
  lr = config.learning_rate
  if (isinstance(lr, bool) or not isinstance(lr, (int, float, np.integer, np.floating))
      or not (math.isfinite(float(lr)) and lr > 0)):
    raise ValueError(f"learning_rate={config.learning_rate} must be a positive finite number")
  check_range("weight_decay", config.weight_decay, low=0,
              hint=" (AdamW's decoupled decay; 0: none)")
  check_range("grad_clip_norm", config.get("grad_clip_norm", 0.0), low=0, hint=" (0: none)")
  for field in ("adam_b1", "adam_b2"):
    check_range(field, config[field], low=0, high=1, high_open=True)
  check_range("adam_eps", config.adam_eps, low=0, low_open=True,
              hint=" (Adam divides by sqrt(nu) + adam_eps: 0 gives NaN where a gradient is "
                   "0; LRA's is 1e-9)")
  check_regexes(config)
  if "label_smoothing" in config:
    check_range("label_smoothing", config.label_smoothing, low=0, high=1, high_open=True)
  check_range("warmup", config.warmup, low=0, integer=True, hint=" (optimizer steps)")
  schedules.create_learning_rate_schedule(factors=config.factors, warmup_steps=config.warmup)
  check_range("max_to_keep", config.max_to_keep, integer=True)
  if int(config.max_to_keep) < 1:
    raise ValueError(f"max_to_keep={config.max_to_keep} must be >= 1, or a killed run "
                     "cannot resume")
  metrics = tuple(steps.Metrics.__annotations__)
  if config.best_metric not in metrics or config.best_mode not in ("max", "min"):
    raise ValueError(f"best_metric={config.best_metric!r} / best_mode={config.best_mode!r}: "
                     f"best_metric must be one of {metrics}, best_mode 'max' or 'min'")
  if float(config.get("max_train_minutes", 0) or 0) < 0:
    raise ValueError(f"max_train_minutes={config.max_train_minutes} must be >= 0 (0: no limit)")
  if "warmup" in str(config.get("factors", "")) and config.warmup > config.num_train_steps:
    warn(f"warmup={config.warmup} exceeds num_train_steps={config.num_train_steps}: the "
         f"learning rate never reaches learning_rate={config.learning_rate}")
  if config.checkpoint_every > config.num_train_steps:
    warn(f"checkpoint_every={config.checkpoint_every} exceeds num_train_steps="
         f"{config.num_train_steps}: only the final step is saved, so a killed run "
         "restarts from step 0")
