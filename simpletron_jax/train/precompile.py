"""``--precompile_workers N``: the train and eval steps compiled, in N threads, for every batch
shape the run will meet (found from the example indices), before the loop (docs/runs.md).

Shapes: train micro-batches from the resume point (:func:`train_scan_count`), a validation
(``num_eval_steps``) and the test (``num_test_steps``); a shape met later compiles in the loop.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any, Callable, Optional

import jax
import numpy as np

from simpletron_jax.data import batches
from simpletron_jax.data.batches import BatchConfig
from simpletron_jax.data.common import Split
from simpletron_jax.train import steps
from simpletron_jax.train.run_config import RunConfig


# Seconds between two looks at ``should_stop`` while the threads compile.
POLL_SECONDS = 0.1
# Grouped train micro-batches scanned when more than one epoch (about 2 s of indexing): one
# ListOps epoch misses the rare 512-token width about one time in three.
SCAN_MICRO_BATCHES = 20_000


class Stopped(Exception):
  """A stop was requested while the steps compiled; nothing was compiled for the loop."""


class CompiledSteps:
  """A step, called as ``(first, placed batch, *rest)``, that runs the program in ``compiled``
  (``{steps.batch_shape_key(batch): program}``) for the batch's shape, else ``step`` itself."""

  def __init__(self, step: Callable, compiled: dict[tuple, Any] | None = None):
    self.step = step
    self.compiled = dict(compiled or {})

  def __call__(self, first, batch, *rest):
    return self.compiled.get(steps.batch_shape_key(batch), self.step)(first, batch, *rest)


def _one_batch_per_width(examples: Split, index_batches, batch_config: BatchConfig
                         ) -> dict[int, dict[str, np.ndarray]]:
  """``{padded width: this host's numpy batch [rows, width] of the first with that width}``."""
  found: dict[int, tuple] = {}
  for indices, valid in index_batches:
    found.setdefault(batches.batch_width(examples, indices, batch_config), (indices, valid))
  return {w: batches.host_batch(examples, idx, batch_config, valid)
          for w, (idx, valid) in sorted(found.items())}


def train_batches_by_width(examples: Split, batch_config: BatchConfig,
                           start_micro_step: int, count: int) -> dict[int, dict[str, np.ndarray]]:
  """``{width in tokens: this host's [rows, width] numpy batch}`` over ``count`` train
  micro-batches from ``start_micro_step``."""
  ds = batches.train_index_batches(examples, batch_config)
  return _one_batch_per_width(
      examples, ((np.asarray(ds[i]), None)
                 for i in range(start_micro_step, start_micro_step + count)), batch_config)


def eval_batches_by_width(examples: Split, batch_config: BatchConfig,
                          num_batches: int) -> dict[int, dict[str, np.ndarray]]:
  """``{width in tokens: this host's [rows, width] numpy batch}`` over the batches
  :func:`evaluation.evaluate` reads."""
  return _one_batch_per_width(examples, batches.eval_index_batches(
      examples, batch_config, batches.eval_batch_size(batch_config), num_batches), batch_config)


def _abstract_by_key(host_batches, parallel) -> dict[tuple, dict[str, jax.ShapeDtypeStruct]]:
  """``{steps.batch_shape_key: abstract placed batch}``, the first per key."""
  found: dict[tuple, dict[str, jax.ShapeDtypeStruct]] = {}
  for batch in host_batches:
    abstract = parallel.abstract_batch(batch)
    found.setdefault(steps.batch_shape_key(abstract), abstract)
  return found


def _eval_batches_by_key(splits, batch_config: BatchConfig,
                         parallel) -> dict[tuple, dict[str, jax.ShapeDtypeStruct]]:
  """One abstract placed batch per batch shape over ``splits``, ``[(Split, num_batches), ...]``."""
  return _abstract_by_key((batch for split, limit in splits for batch in
                           eval_batches_by_width(split, batch_config, limit).values()), parallel)


def _in_threads(thunks: list[Callable[[], Any]], workers: int,
                should_stop: Optional[Callable[[], bool]] = None) -> list[Any]:
  """The results of every thunk, in order, run in ``workers`` threads.

  On a stop, an exception or Ctrl-C, thunks not started are cancelled and running ones
  awaited (a process exiting while XLA compiles aborts), then it raises.

  Raises:
    ValueError: ``workers < 1``.
    Stopped: ``should_stop()`` became true.
    Exception: the first exception a thunk raised.
  """
  if workers < 1:
    raise ValueError(f"precompile workers must be >= 1, got {workers} (--precompile_workers)")
  pool = concurrent.futures.ThreadPoolExecutor(max(1, min(workers, len(thunks))))
  futures = []   # filled one by one: a Ctrl-C can arrive between two submits
  try:
    for thunk in thunks:
      futures.append(pool.submit(thunk))
    pending = set(futures)
    while pending:
      done, pending = concurrent.futures.wait(
          pending, timeout=POLL_SECONDS, return_when=concurrent.futures.FIRST_EXCEPTION)
      for future in done:
        if future.exception() is not None:
          raise future.exception()
      if pending and should_stop is not None and should_stop():
        raise Stopped("a stop was requested while the steps compiled")
    return [future.result() for future in futures]
  finally:
    pool.shutdown(wait=False, cancel_futures=True)
    interrupted = None
    while True:
      try:
        concurrent.futures.wait([f for f in futures if not f.cancelled()])   # the running
        break
      except KeyboardInterrupt as e:   # XLA cannot be interrupted: wait, then stop
        interrupted = e
    pool.shutdown(wait=True)
    if interrupted is not None:
      raise interrupted   # pylint: disable=lost-exception


def precompile_eval_step(p_eval: Callable, params_repl, splits, batch_config: BatchConfig,
                         workers: int, parallel=None,
                         should_stop: Optional[Callable[[], bool]] = None) -> CompiledSteps:
  """:class:`CompiledSteps` of ``p_eval`` for the shapes of ``splits``, ``[(Split, batches)]``.

  Raises:
    ValueError: ``workers < 1``.
    Stopped: ``should_stop()`` became true.
  """
  evals = _eval_batches_by_key(splits, batch_config, parallel or steps.PmapParallel())
  programs = _in_threads([lambda b=b: p_eval.lower(params_repl, b).compile()
                          for b in evals.values()], workers, should_stop)
  return CompiledSteps(p_eval, dict(zip(evals, programs)))


def train_scan_count(batch_config: BatchConfig, num_train_steps: int, n_train: int,
                     start_micro_step: int) -> int:
  """Train micro-batches to scan: the rest of a run of ``num_train_steps`` optimizer steps,
  capped at one epoch or, grouped, at the longer of one epoch and :data:`SCAN_MICRO_BATCHES`."""
  remaining = max(num_train_steps * batch_config.grad_accum_steps - start_micro_step, 0)
  epoch = max(n_train // batch_config.micro_batch_size, 1)
  if batch_config.group_by_length:
    return min(remaining, max(epoch, SCAN_MICRO_BATCHES))
  return min(remaining, epoch)


def precompile_steps(p_train: Callable, p_eval: Callable, state_repl, data, run: RunConfig,
                     start_micro_step: int, workers: int, parallel=None,
                     should_stop: Optional[Callable[[], bool]] = None
                     ) -> tuple[CompiledSteps, CompiledSteps, dict[str, Any]]:
  """Compiles the train and eval steps for every batch shape the run will meet.

  Returns ``(train_steps, eval_steps, info)``: :class:`CompiledSteps`, and ``info`` =
  ``{"precompile_seconds", "precompiled_train_shapes", "precompiled_eval_shapes"}``.

  Raises:
    ValueError: ``workers < 1``.
    Stopped: ``should_stop()`` became true (SIGTERM, SIGINT).
  """
  start = time.time()
  count = train_scan_count(run.batches, run.train.num_train_steps, len(data.train),
                           start_micro_step)
  parallel = parallel or steps.PmapParallel()
  train = _abstract_by_key(train_batches_by_width(
      data.train, run.batches, start_micro_step, count).values(), parallel)
  evals = _eval_batches_by_key([(data.val, run.eval.num_eval_steps),
                                (data.test, run.eval.num_test_steps)], run.batches, parallel)
  rng = jax.random.PRNGKey(0)   # only its shape and dtype are read
  programs = _in_threads(
      [lambda b=b: p_train.lower(state_repl, b, rng).compile()
       for b in train.values()]
      + [lambda b=b: p_eval.lower(state_repl.params, b).compile()
         for b in evals.values()], workers, should_stop)
  train_steps = CompiledSteps(p_train, dict(zip(train, programs[:len(train)])))
  eval_steps = CompiledSteps(p_eval, dict(zip(evals, programs[len(train):])))
  info = {"precompile_seconds": time.time() - start,
          "precompiled_train_shapes": len(train_steps.compiled),
          "precompiled_eval_shapes": len(eval_steps.compiled)}
  return train_steps, eval_steps, info
