"""Compiling a run's train and eval steps for every batch shape it will meet, before the loop.

Batches are padded to a length bucket (``data.bucket``, 128 tokens in the LRA configs), and
``jax.pmap`` compiles one program per batch shape the first time it sees it, in the middle of
the loop and one after another. A grouped ListOps run (``data.group_by_length``) meets all 16
buckets of its 2000 tokens; the benchmark model's ``simple`` step took 9 to 14 s to compile on an
H100 (issue 10). ``train.py --precompile_workers N`` finds the shapes first, from the example
indices alone, and compiles them in ``N`` threads side by side (XLA compiles with Python's lock
released); the loop then calls the compiled programs. The function computed is unchanged: the
same programs run on the same batches.

Which shapes: the train micro-batches from the resume point to the end of the run or of one
epoch, whichever comes first, and the batches of a validation (``num_eval_steps``) and of the
final test (``num_test_steps``). A shape met later still compiles in the loop, as before.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any, Callable

import jax
import ml_collections
import numpy as np

from simpletron_jax import train_lib
from simpletron_jax.data.common import Split

ShapeKey = tuple  # ((field, shape), ...) of a sharded batch, sorted by field


def shape_key(batch: dict[str, Any]) -> ShapeKey:
  """The key of a sharded batch's shapes, ``((field, shape), ...)`` sorted by field."""
  return tuple(sorted((k, tuple(v.shape)) for k, v in batch.items()))


class CompiledSteps:
  """A pmapped step that runs a precompiled program for the batch shapes it has one for.

  Called like the step, ``(first, batch, *rest)`` with ``batch`` the sharded batch dict; a
  shape without a program goes to the step itself, which compiles it as usual.

  Attributes:
    step: the ``jax.pmap``ped step.
    compiled: ``{shape_key(batch): compiled program}``.
  """

  def __init__(self, step: Callable, compiled: dict[ShapeKey, Any] | None = None):
    self.step = step
    self.compiled = dict(compiled or {})

  def has(self, batch: dict[str, Any]) -> bool:
    """True when ``batch``'s shapes have a precompiled program."""
    return shape_key(batch) in self.compiled

  def __call__(self, first, batch, *rest):
    return self.compiled.get(shape_key(batch), self.step)(first, batch, *rest)


def _widths_to_indices(examples: Split, index_batches, config) -> dict[int, np.ndarray]:
  """``{padded width: the first index array with that width}`` over ``index_batches``."""
  found: dict[int, np.ndarray] = {}
  for indices in index_batches:
    indices = np.asarray(indices)
    found.setdefault(train_lib.batch_width(examples, indices, config), indices)
  return found


def train_batches_by_width(examples: Split, config: ml_collections.ConfigDict,
                           start_micro_step: int, count: int) -> dict[int, dict[str, np.ndarray]]:
  """One sharded train micro-batch per padded width among micro-batches
  ``start_micro_step .. start_micro_step + count - 1`` (:func:`train_lib.train_batches`).

  Returns:
    ``{width in tokens: [n_devices, rows / n_devices, ...] numpy batch}``.
  """
  ds = train_lib.train_index_batches(examples, config)
  found = _widths_to_indices(
      examples, (ds[i] for i in range(start_micro_step, start_micro_step + count)), config)
  n_dev = jax.local_device_count()
  return {w: train_lib.shard(train_lib.host_batch(examples, idx, config), n_dev)
          for w, idx in sorted(found.items())}


def eval_batches_by_width(examples: Split, config: ml_collections.ConfigDict,
                          num_batches: int) -> dict[int, dict[str, np.ndarray]]:
  """One sharded batch per padded width among the batches :func:`train_lib.evaluate` reads.

  Returns:
    ``{width in tokens: [n_devices, rows / n_devices, ...] numpy batch}``.
  """
  batch_size = train_lib.eval_batch_size(config)
  pairs = list(train_lib.eval_index_batches(examples, config, batch_size, num_batches))
  found: dict[int, tuple] = {}
  for idx, valid in pairs:
    found.setdefault(train_lib.batch_width(examples, idx, config), (idx, valid))
  n_dev = jax.local_device_count()
  return {w: train_lib.shard(train_lib.host_batch(examples, idx, config, valid), n_dev)
          for w, (idx, valid) in sorted(found.items())}


def _abstract(batch: dict[str, np.ndarray]) -> dict[str, jax.ShapeDtypeStruct]:
  return {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}


def precompile_steps(p_train: Callable, p_eval: Callable, state_repl, data,
                     config: ml_collections.ConfigDict, start_micro_step: int,
                     workers: int) -> tuple[CompiledSteps, CompiledSteps, dict[str, Any]]:
  """Compiles the train and eval steps for every batch shape the run will meet, in threads.

  Args:
    p_train, p_eval: the pmapped steps of :func:`train_lib.pmap_steps`.
    state_repl: the replicated train state (only its shapes and dtypes are read).
    data: the run's :class:`simpletron_jax.tasks.TaskData`.
    config: the run config.
    start_micro_step: the first micro-step this run trains (the resume point).
    workers: compiling threads, at least 1.

  Returns:
    ``(train_steps, eval_steps, info)``: :class:`CompiledSteps` for ``p_train`` and
    ``p_eval``, and ``info`` = ``{"precompile_seconds", "precompiled_train_shapes",
    "precompiled_eval_shapes"}`` (wall seconds, counts).

  Raises:
    ValueError: for ``workers < 1``.
  """
  if workers < 1:
    raise ValueError(f"precompile workers must be >= 1, got {workers} (--precompile_workers)")
  start = time.time()
  accum = config.grad_accum_steps
  micro = config.batch_size // accum
  remaining = max(config.num_train_steps * accum - start_micro_step, 0)
  count = min(remaining, max(len(data.train) // micro, 1))
  train = train_batches_by_width(data.train, config, start_micro_step, count)
  evals: dict[ShapeKey, dict[str, np.ndarray]] = {}
  for split, limit in ((data.val, config.get("num_eval_steps", -1)),
                       (data.test, config.get("num_test_steps", -1))):
    for batch in eval_batches_by_width(split, config, limit).values():
      evals.setdefault(shape_key(batch), batch)
  rng = jax.random.PRNGKey(0)   # only its shape and dtype are read
  jobs = [("train", shape_key(b), lambda b=b: p_train.lower(state_repl, _abstract(b), rng))
          for b in train.values()]
  jobs += [("eval", key, lambda b=b: p_eval.lower(state_repl.params, _abstract(b)))
           for key, b in evals.items()]
  with concurrent.futures.ThreadPoolExecutor(max(1, min(workers, len(jobs)))) as pool:
    compiled = list(pool.map(lambda job: job[2]().compile(), jobs))
  train_steps, eval_steps = CompiledSteps(p_train), CompiledSteps(p_eval)
  for (kind, key, _), program in zip(jobs, compiled):
    (train_steps if kind == "train" else eval_steps).compiled[key] = program
  info = {"precompile_seconds": time.time() - start,
          "precompiled_train_shapes": len(train_steps.compiled),
          "precompiled_eval_shapes": len(eval_steps.compiled)}
  return train_steps, eval_steps, info
