"""Checks of the ``model`` and ``data`` fields and of the loaded splits; each refusal is one
line naming the field."""

from __future__ import annotations

import math
from typing import Any

import ml_collections
import numpy as np

from simpletron_jax.data import batches, tasks
from simpletron_jax.model import attention, encoders
from simpletron_jax.runtime.errors import warn

# Bytes of the largest position table, (model.max_length + 1) x model.emb_dim float32, a run
# may ask for (Path-X: 8 MiB); past it a typo would fail in XLA with RESOURCE_EXHAUSTED.
MAX_POSITION_TABLE_BYTES = 4 << 30


def check_model_and_data(config: ml_collections.ConfigDict) -> encoders.ModelConfig:
  """The typed ``config.model`` (``encoders.ModelConfig``), once ``model`` and ``data`` pass.

  Warns:
    RunWarning: ``model.attention_kwargs`` holds options the run's attention ignores.

  Raises:
    ValueError: one line naming the field and value: ``data.seed`` not an int >= 0; a
      ``model`` size not a positive int; a dropout rate outside [0, 1); ``data.bucket`` < 0,
      ``data.group_pool_batches`` < 1, ``data.val_fraction`` outside [0, 1); a position
      table over :data:`MAX_POSITION_TABLE_BYTES`; any ``ModelConfig`` problem.
  """
  check = check_range
  model = config.model
  for field in ("emb_dim", "qkv_dim", "mlp_dim", "num_heads", "num_layers", "max_length"):
    check(f"model.{field}", model[field], low=1, integer=True)
  check_position_table(model.max_length, model.emb_dim)
  for field in ("dropout_rate", "attention_dropout_rate"):
    check(f"model.{field}", model[field], low=0, high=1, high_open=True)
  kwargs = model.attention_kwargs if "attention_kwargs" in model else None
  for key, value in (kwargs or {}).items():
    if "dropout" in key and not isinstance(value, bool):
      check(f"model.attention_kwargs.{key}", value, low=0, high=1, high_open=True)
  data = config.data
  for field, low, hint in (("seed", 0, ""), ("bucket", 0, " (0: max_length)"),
                           ("group_pool_batches", 1, "")):
    if field in data:
      check(f"data.{field}", data[field], low=low, integer=True, hint=hint)
  if "val_fraction" in data:
    check("data.val_fraction", data.val_fraction, low=0, high=1, high_open=True)
  if model.qkv_dim % model.num_heads:
    divisors = [h for h in range(1, model.qkv_dim + 1) if model.qkv_dim % h == 0][:8]
    raise ValueError(f"model.qkv_dim={model.qkv_dim} is not divisible by model.num_heads="
                     f"{model.num_heads}: each head gets qkv_dim / num_heads features; set "
                     f"model.num_heads to a divisor of {model.qkv_dim} "
                     f"({', '.join(map(str, divisors))}, ...) or change model.qkv_dim")
  typed = encoders.ModelConfig.from_config_dict(model)
  dropped = attention.inherited_options(model.attention, kwargs or {})
  if dropped:
    warn(f"model.attention_kwargs {dropped}: options of other attentions at their defaults, "
         f"left by a switch of model.attention; {model.attention!r} has no such options and "
         "ignores them")
  return typed


def check_splits(data: Any, batch_config: batches.BatchConfig, data_dir: Any) -> None:
  """Each split of ``data`` (``TaskData``) must be non-empty, train at least a micro-batch;
  ``data_dir`` is the config's ``data.data_dir`` (None: unset).

  Raises:
    ValueError: naming the empty split, the data source and ``data.data_dir``.
  """
  micro = batch_config.micro_batch_size
  where = f"data source {data.source!r} (config field data.data_dir={data_dir!r})"
  for name in ("train", "val", "test"):
    if len(getattr(data, name)) == 0:
      raise ValueError(f"the {name} split is empty; {where}")
  if len(data.train) < micro:
    raise ValueError(f"the train split has {len(data.train)} examples, fewer than one "
                     f"micro-batch of {micro} (config fields batch_size, grad_accum_steps); "
                     f"{where}")


def check_position_table(max_length: int, emb_dim: int,
                         limit: int = MAX_POSITION_TABLE_BYTES) -> None:
  """Refuses a float32 position table of ``max_length + 1`` x ``emb_dim`` over ``limit`` bytes.

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


def check_range(field: str, value: Any, *, low: float | None = None, high: float | None = None,
                high_open: bool = False, integer: bool = False, hint: str = "",
                low_open: bool = False) -> None:
  """Refuses ``value`` of ``field`` unless a finite number (an int, not a bool, if ``integer``)
  in ``[low, high]``: ``*_open`` excludes a bound, None leaves it open; ``hint`` ends the message.

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
