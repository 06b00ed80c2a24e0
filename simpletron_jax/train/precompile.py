"""Compiling a run's train and eval steps for every batch shape it will meet, before the loop.

Batches are padded to a length bucket (``data.bucket``, 128 tokens in the LRA configs), and
``jax.pmap`` compiles one program per batch shape the first time it sees it, in the middle of
the loop and one after another. A grouped run (``data.group_by_length``) meets more widths
than an ungrouped one, each compiled while the device waits (docs/runs.md has the widths of
paper ListOps and the compile times). ``train.py --precompile_workers N`` finds the
shapes first, from the example indices alone, and compiles them in ``N`` threads side by side
(XLA compiles with Python's lock released); the loop then calls the compiled programs.
The function computed is unchanged: the same programs run on the same batches.

Which shapes: the train micro-batches from the resume point to the end of the run or of one
epoch, whichever comes first (a grouped run, ``data.group_by_length``: of
:data:`SCAN_MICRO_BATCHES` micro-batches when that is longer, since it meets its rarest width
in some epochs only), and the batches of a validation (``num_eval_steps``) and of the final
test (``num_test_steps``). A shape met later still compiles in the loop, as usual.

A stop requested while the threads compile (``should_stop``: SIGTERM or SIGINT, through
:class:`simpletron_jax.run.preemption.PreemptionGuard`) cancels the compilations not yet started,
waits for the ones running (XLA cannot be interrupted) and raises :class:`Stopped`; the
caller then stops as a preempted run does, with no traceback.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any, Callable, Optional

import jax
import ml_collections
import numpy as np

from simpletron_jax.data import batches
from simpletron_jax.data.common import Split
from simpletron_jax.train import steps
from simpletron_jax.train.run_config import EvalConfig


# Seconds between two looks at ``should_stop`` while the threads compile.
POLL_SECONDS = 0.1
# Grouped train micro-batches whose widths are looked up, when more than one epoch: 20,000
# take about 2 s of indexing (the 15,000 steps of paper ListOps, 5 epochs, fit). On
# ListOps with 512-token buckets a pool of 50 batches holds a 512-token batch 1.7% of the
# time, so one epoch of 60 pools misses that width about one time in three.
SCAN_MICRO_BATCHES = 20_000


class Stopped(Exception):
  """A stop was requested while the steps compiled; nothing was compiled for the loop."""


class CompiledSteps:
  """A train or eval step that runs a precompiled program for the batch shapes it has one for.

  Called like the step, ``(first, batch, *rest)`` with ``batch`` the placed batch dict
  (``parallel.put_batch``); a shape without a program goes to the step itself, which compiles
  it as usual.

  Attributes:
    step: the ``jax.pmap``ped or ``jax.jit``ted step (:mod:`simpletron_jax.train.steps`).
    compiled: ``{steps.batch_shape_key(batch): compiled program}``.
  """

  def __init__(self, step: Callable, compiled: dict[tuple, Any] | None = None):
    self.step = step
    self.compiled = dict(compiled or {})

  def __call__(self, first, batch, *rest):
    return self.compiled.get(steps.batch_shape_key(batch), self.step)(first, batch, *rest)


def _one_batch_per_width(examples: Split, index_batches, config
                         ) -> dict[int, dict[str, np.ndarray]]:
  """``{padded width: the first of index_batches' (indices, valid) with it, as this host's
  numpy batch [rows, ...]}``."""
  found: dict[int, tuple] = {}
  for indices, valid in index_batches:
    found.setdefault(batches.batch_width(examples, indices, config), (indices, valid))
  return {w: batches.host_batch(examples, idx, config, valid)
          for w, (idx, valid) in sorted(found.items())}


def train_batches_by_width(examples: Split, config: ml_collections.ConfigDict,
                           start_micro_step: int, count: int) -> dict[int, dict[str, np.ndarray]]:
  """One sharded train micro-batch per padded width among micro-batches
  ``start_micro_step .. start_micro_step + count - 1`` (:func:`batches.train_batches`).

  Returns:
    ``{width in tokens: this host's [rows, width] numpy batch}``.
  """
  ds = batches.train_index_batches(examples, config)
  return _one_batch_per_width(
      examples, ((np.asarray(ds[i]), None)
                 for i in range(start_micro_step, start_micro_step + count)), config)


def eval_batches_by_width(examples: Split, config: ml_collections.ConfigDict,
                          num_batches: int) -> dict[int, dict[str, np.ndarray]]:
  """One batch per padded width among the batches :func:`evaluation.evaluate` reads.

  Returns:
    ``{width in tokens: this host's [rows, width] numpy batch}``.
  """
  return _one_batch_per_width(examples, batches.eval_index_batches(
      examples, config, batches.eval_batch_size(config), num_batches), config)


def _abstract_by_key(host_batches, parallel) -> dict[tuple, dict[str, jax.ShapeDtypeStruct]]:
  """``{steps.batch_shape_key: abstract placed batch}`` of host batches, the first per key."""
  found: dict[tuple, dict[str, jax.ShapeDtypeStruct]] = {}
  for batch in host_batches:
    abstract = parallel.abstract_batch(batch)
    found.setdefault(steps.batch_shape_key(abstract), abstract)
  return found


def _eval_batches_by_key(splits, config, parallel) -> dict[tuple, dict[str, jax.ShapeDtypeStruct]]:
  """One abstract placed batch per batch shape over ``splits``, ``[(Split, num_batches), ...]``."""
  return _abstract_by_key((batch for split, limit in splits
                           for batch in eval_batches_by_width(split, config, limit).values()),
                          parallel)


def _in_threads(thunks: list[Callable[[], Any]], workers: int,
                should_stop: Optional[Callable[[], bool]] = None) -> list[Any]:
  """Calls every thunk in a pool of ``workers`` threads; their results in order.

  The calling thread only waits, looking at ``should_stop`` every :data:`POLL_SECONDS`. On a
  stop, or when a thunk raises (or ``KeyboardInterrupt`` reaches the waiting thread), the
  thunks not started are cancelled and the running ones are waited for before it returns,
  even through a ``KeyboardInterrupt`` (a second Ctrl-C), which is raised once they are done:
  no compiling thread outlives the call. A process that exits while XLA compiles in another
  thread aborts (``terminate called ... FATAL: exception not rethrown``).

  Raises:
    ValueError: for ``workers < 1``.
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


def precompile_eval_step(p_eval: Callable, params_repl, splits, config: ml_collections.ConfigDict,
                         workers: int, parallel=None,
                         should_stop: Optional[Callable[[], bool]] = None) -> CompiledSteps:
  """Compiles the eval step for every batch shape that evaluating ``splits`` meets (eval.py).

  Args:
    p_eval: the eval step of ``parallel.steps``.
    params_repl: the parameters as ``p_eval`` takes them (only shapes, dtypes and
      shardings are read).
    splits: ``[(Split, num_batches), ...]`` as :func:`evaluation.evaluate` reads them.
    config: the run config.
    workers: compiling threads, at least 1.
    parallel: :func:`steps.make_parallel` of the run (default: pmap's).
    should_stop: polled while the threads compile; True stops them (:func:`_in_threads`).

  Returns:
    A :class:`CompiledSteps` for ``p_eval``.

  Raises:
    ValueError: for ``workers < 1``.
    Stopped: ``should_stop()`` became true.
  """
  evals = _eval_batches_by_key(splits, config, parallel or steps.PmapParallel())
  programs = _in_threads([lambda b=b: p_eval.lower(params_repl, b).compile()
                          for b in evals.values()], workers, should_stop)
  return CompiledSteps(p_eval, dict(zip(evals, programs)))


def train_scan_count(config: ml_collections.ConfigDict, n_train: int,
                     start_micro_step: int) -> int:
  """How many train micro-batches from ``start_micro_step`` :func:`precompile_steps` reads the
  widths of: the rest of the run, at most one epoch of ``n_train`` examples, or for a grouped
  run (``data.group_by_length``) at most the longer of one epoch and
  :data:`SCAN_MICRO_BATCHES` (the ungrouped order is indexed through grain, about 0.5 ms a
  micro-batch, the grouped one in tens of microseconds)."""
  remaining = max(config.num_train_steps * config.grad_accum_steps - start_micro_step, 0)
  epoch = max(n_train // batches.micro_batch_size(config), 1)
  if config.data.get("group_by_length", False):
    return min(remaining, max(epoch, SCAN_MICRO_BATCHES))
  return min(remaining, epoch)


def precompile_steps(p_train: Callable, p_eval: Callable, state_repl, data,
                     config: ml_collections.ConfigDict, eval_config: EvalConfig,
                     start_micro_step: int,
                     workers: int, parallel=None,
                     should_stop: Optional[Callable[[], bool]] = None
                     ) -> tuple[CompiledSteps, CompiledSteps, dict[str, Any]]:
  """Compiles the train and eval steps for every batch shape the run will meet, in threads.

  Args:
    p_train, p_eval: the steps of ``parallel.steps``.
    state_repl: the train state as ``p_train`` takes it (only its shapes, dtypes and
      shardings are read).
    data: the run's :class:`simpletron_jax.data.tasks.TaskData`.
    config: the run config, as the data layer reads it (:mod:`simpletron_jax.data.batches`).
    eval_config: the run's :class:`run_config.EvalConfig` (``num_eval_steps``,
      ``num_test_steps``).
    start_micro_step: the first micro-step this run trains (the resume point).
    workers: compiling threads, at least 1.
    parallel: :func:`steps.make_parallel` of the run (default: pmap's).
    should_stop: polled while the threads compile; True stops them (:func:`_in_threads`).

  Returns:
    ``(train_steps, eval_steps, info)``: :class:`CompiledSteps` for ``p_train`` and
    ``p_eval``, and ``info`` = ``{"precompile_seconds", "precompiled_train_shapes",
    "precompiled_eval_shapes"}`` (wall seconds, counts).

  Raises:
    ValueError: for ``workers < 1``.
    Stopped: ``should_stop()`` became true.
  """
  start = time.time()
  count = train_scan_count(config, len(data.train), start_micro_step)
  parallel = parallel or steps.PmapParallel()
  train = _abstract_by_key(train_batches_by_width(
      data.train, config, start_micro_step, count).values(), parallel)
  evals = _eval_batches_by_key([(data.val, eval_config.num_eval_steps),
                                (data.test, eval_config.num_test_steps)], config, parallel)
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
