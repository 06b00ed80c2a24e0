"""The parts of the training loop: one optimizer step, the train window and the periodic actions.

:func:`simpletron_jax.train.trainer.train_and_evaluate` sets a run up and then, for each optimizer
step, runs :class:`MicroSteps` and calls :class:`Actions`, whose periodic actions
(:class:`Periodic`) run in this order after the step:

* a train record of the window since the last one (:class:`TrainWindow`), every
  ``log_every`` steps (:class:`run_config.LoggingConfig`);
* a validation, every ``eval_frequency`` steps; a new best (by ``best_metric`` and
  ``best_mode``; :class:`run_config.EvalConfig`) is saved at once, and kept as the best;
* a checkpoint in ``checkpoints/``, every ``checkpoint_every`` steps
  (:class:`run_config.CheckpointConfig`);
* the caller's step hook, every step (after the step's checkpoints are on disk).

The run's last step (``num_train_steps``, the ``max_train_minutes`` budget, a preemption)
forces the record and the checkpoint, and the validation unless only a preemption stopped the
run. Before a record, a validation or a checkpoint, the micro-steps since the last check are
checked to be finite (:func:`check_finite`), so a non-finite state is never logged or saved.

Units: a *step* is one optimizer update on ``batch_size`` examples, made of
``grad_accum_steps`` *micro-steps* (see :mod:`simpletron_jax.train.steps`); times are
seconds.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any, Callable, Iterator

import jax
import numpy as np
import orbax.checkpoint as ocp

from simpletron_jax.runtime import distributed, errors
from simpletron_jax.train import steps
from simpletron_jax.run import run_guard
from simpletron_jax.train.checkpoints import best_score, finish_saves, save_checkpoint, step_dir
from simpletron_jax.run.metric_logging import MetricLogger
from simpletron_jax.train.run_config import CheckpointConfig, EvalConfig, LoggingConfig
from simpletron_jax.train.steps import InFlightLimit, JitParallel, PmapParallel, TrainState


def check_finite(unchecked: list, state_repl: TrainState, last_good: str,
                 parallel: PmapParallel | JitParallel | None = None) -> None:
  """Stops a run whose training went non-finite, before anything is logged or saved.

  Args:
    unchecked: ``(optimizer step, metrics)`` of the micro-steps since the last check, as
      returned by the train step (its ``Metrics``' loss sum and ``grad_norm`` are checked).
    state_repl: the state after the last of them, as the steps return it.
    last_good: the newest checkpoint saved, for the message.
    parallel: the run's :func:`steps.make_parallel` (default: pmap's).

  Raises:
    errors.NonFiniteError: naming the first step whose loss or gradient norm is NaN or
      inf (or the last step, when only the parameters are), and ``last_good``.
  """
  parallel = parallel or PmapParallel()
  bad = run_guard.first_nonfinite(
      [(step, parallel.host({"loss": metrics["metrics"].loss.total,
                             "grad_norm": metrics["grad_norm"]})) for step, metrics in unchecked])
  # On one host the parameters are checked where they are (one flag read back), instead of
  # being copied to the host and back every record (78 MB each way for paper ListOps).
  params = (state_repl.params if jax.process_count() == 1
            else parallel.host(state_repl.params))
  if bad is None and not run_guard.tree_is_finite(params):
    bad = (unchecked[-1][0] if unchecked else -1, {"params": float("nan")})
  if bad is not None:
    step, values = bad
    shown = ", ".join(f"{k} {v}" for k, v in values.items())
    raise errors.NonFiniteError(
        f"step {step}: training became non-finite ({shown}). The run stopped without saving "
        f"this state; the last good checkpoint is {last_good}. Lower learning_rate, raise "
        "warmup or set grad_clip_norm, then resume or start a new workdir.")


class Periodic:
  """An action after every ``every_steps``-th optimizer step (a multiple of ``every_steps``),
  and after any step a call forces (the run's last): clu ``periodic_actions``' step rule.

  clu's ``PeriodicCallback`` itself is not used: clu 0.0.12's ``periodic_actions`` imports
  ``clu.metric_writers``, whose package imports TensorFlow, and train.py runs without
  TensorFlow (tests/test_no_tensorflow.py).

  Args:
    every_steps: the period in optimizer steps (>= 1).
    callback_fn: called as ``callback_fn(step, **kwargs)``.
  """

  def __init__(self, every_steps: int, callback_fn: Callable[..., None]):
    self.every_steps, self.callback_fn = every_steps, callback_fn

  def __call__(self, step: int, force: bool = False, **kwargs) -> bool:
    """Runs the callback when ``step`` is a multiple of ``every_steps`` or ``force``;
    returns whether it ran."""
    if force or step % self.every_steps == 0:
      self.callback_fn(step, **kwargs)
      return True
    return False


class TrainWindow:
  """The train record of the steps since the last record: metric means and throughput.

  :class:`MicroSteps` adds each micro-step's :data:`steps.Metrics` (``metrics``, device
  arrays) and the seconds of each call that compiled a new batch shape; :meth:`record` merges
  them.

  Args:
    parallel: the run's :func:`steps.make_parallel` (reads the metrics to the host).
    schedule: the learning-rate schedule, a function of the optimizer update count.
    train_seconds: the train seconds of the run's earlier starts (a checkpoint's).

  Attributes:
    train_seconds: seconds spent training so far, without validations, checkpoints and the
      step hook (:meth:`exclude`), at the last record.
    compile_seconds_this_run: seconds of this start's train calls that compiled a new shape.
    shapes_compiled: how many train calls of this start compiled a new shape.
  """

  def __init__(self, parallel: PmapParallel | JitParallel, schedule: Callable,
               train_seconds: float):
    self.parallel, self.schedule = parallel, schedule
    self.train_seconds = float(train_seconds)
    self.compile_seconds_this_run, self.shapes_compiled = 0.0, 0
    self.restart()

  def restart(self) -> None:
    """Starts a new window (its clock too)."""
    self.metrics, self.steps, self.compile_seconds, self.new_shapes = [], 0, 0.0, 0
    self.start, self.excluded = time.time(), 0.0

  def compiled(self, seconds: float) -> None:
    """A train call that compiled a new batch shape took ``seconds``."""
    self.compile_seconds += seconds
    self.new_shapes += 1
    self.shapes_compiled += 1

  def exclude(self, seconds: float) -> None:
    """``seconds`` of this window that were not training (validation, checkpoint, hook)."""
    self.excluded += seconds

  def record(self, step: int) -> dict[str, float]:
    """The train record of the window ending at optimizer ``step``: every
    :data:`steps.Metrics` mean over the window's real examples (clu's merge in float64 on the
    host, in micro-step order), ``learning_rate`` of the step, ``steps_per_sec`` with and
    without compile time, ``compile_seconds`` and ``new_shapes``. Adds the window to the
    totals; call :meth:`restart` once the record is written."""
    host = jax.tree_util.tree_map(np.float64, (steps.Metrics.empty(),
                                               *self.parallel.host(self.metrics)))
    merged = functools.reduce(lambda a, b: a.merge(b), host)
    elapsed = max(time.time() - self.start - self.excluded, 1e-9)
    self.train_seconds += elapsed
    self.compile_seconds_this_run += self.compile_seconds
    return {**merged.compute(),
            "learning_rate": float(self.schedule(step - 1)),
            "steps_per_sec": self.steps / elapsed,
            "steps_per_sec_excluding_compile":
                self.steps / max(elapsed - self.compile_seconds, 1e-9),
            "compile_seconds": self.compile_seconds, "new_shapes": self.new_shapes}


class MicroSteps:
  """Runs one optimizer step as ``grad_accum_steps`` micro-steps on the next batches.

  Micro-step ``i`` of the run (counted from 0 over all starts) reads the next batch of
  ``batches`` and dropout key ``fold_in(dropout_root, i)``, so a resumed run repeats an
  uninterrupted one. A batch shape met for the first time is compiled inside its call; that
  call waits for the queued calls first, so its time (:meth:`TrainWindow.compiled`) is the
  compile's alone. At most :data:`steps.CALLS_IN_FLIGHT` calls are unfinished at once.

  Args:
    p_train: the train step of ``parallel.steps``.
    programs: ``{steps.batch_shape_key: compiled train step}`` (precompiled shapes; may be
      empty).
    parallel: the run's :func:`steps.make_parallel`.
    batches: the host micro-batches from the run's start (:func:`batches.train_batches`).
    dropout_root: the run's dropout key.
    accum: micro-steps per optimizer step.

  Attributes:
    unchecked: ``(optimizer step, metrics)`` of the micro-steps not yet checked to be finite.
  """

  def __init__(self, p_train: Callable, programs: dict, parallel: PmapParallel | JitParallel,
               batches: Iterator, dropout_root: jax.Array, accum: int):
    self.p_train, self.programs, self.parallel = p_train, programs, parallel
    self.batches, self.dropout_root, self.accum = batches, dropout_root, accum
    self.seen = set(programs)   # precompiled shapes count as seen
    self.in_flight = InFlightLimit()
    self.unchecked: list = []

  def __call__(self, state_repl: TrainState, step: int, window: TrainWindow) -> TrainState:
    """Optimizer ``step`` (from 1) on ``state_repl``; returns the new state and adds the
    micro-steps' metrics to ``window``."""
    for a in range(self.accum):
      batch = self.parallel.put_batch(next(self.batches))
      rng = jax.random.fold_in(self.dropout_root, (step - 1) * self.accum + a)
      shapes = steps.batch_shape_key(batch)
      step_fn = self.programs.get(shapes, self.p_train)
      if shapes in self.seen:
        state_repl, out = step_fn(state_repl, batch, rng)
      else:   # drain the queue first, so the call's time is the compile's alone
        jax.block_until_ready(state_repl)
        call_start = time.time()
        state_repl, out = step_fn(state_repl, batch, rng)
        self.seen.add(shapes)
        window.compiled(time.time() - call_start)
      window.metrics.append(out["metrics"])
      self.unchecked.append((step, out))
      self.in_flight.add(out)
    window.steps += 1
    return state_repl

  def check_finite(self, state_repl: TrainState, last_good: str) -> None:
    """:func:`check_finite` of the unchecked micro-steps (none: nothing to do, the state is
    the one checked last); raises ``errors.NonFiniteError``."""
    if self.unchecked:
      check_finite(self.unchecked, state_repl, last_good, self.parallel)
      self.unchecked = []


class TimeBudget:
  """``max_train_minutes`` (0: none) from ``wall_start`` (``time.time()`` seconds)."""

  def __init__(self, minutes: float, wall_start: float):
    self.seconds, self.wall_start = 60.0 * float(minutes or 0), wall_start

  def spent(self) -> bool:
    """True once the budget is spent, the same on every host (a collective when set)."""
    return bool(self.seconds) and distributed.agree_on_flag(
        time.time() - self.wall_start > self.seconds)


class Actions:
  """What a run does after each optimizer step (see the module docstring), in order.

  Args:
    eval_config: the run's :class:`run_config.EvalConfig` (``eval_frequency``,
      ``best_metric``, ``best_mode``).
    checkpoint: its :class:`run_config.CheckpointConfig` (``checkpoint_every``).
    logging: its :class:`run_config.LoggingConfig` (``log_every``).
    micro_steps: the run's :class:`MicroSteps` (the finiteness check).
    window: the run's :class:`TrainWindow`.
    logger: the run's :class:`MetricLogger`.
    bar: the progress bar (:func:`simpletron_jax.runtime.progress.bar`).
    validate: ``validate(params_repl) -> metrics`` of the validation split
      (:func:`simpletron_jax.train.evaluation.evaluate`).
    ckpts: the manager of ``checkpoints/``.
    meta: the checkpoint meta (``best_score``, ``best_step``, ``best_val_accuracy``, ``train_seconds``,
      ``val_majority_rate``, the run id and record), updated in place.
    last_good: the newest checkpoint's folder (or a phrase saying there is none).
    step_hook: called with the step after its checkpoints are on disk, or None.

  Attributes:
    meta, last_good: as updated by the actions.
  """

  def __init__(self, eval_config: EvalConfig, checkpoint: CheckpointConfig,
               logging: LoggingConfig, micro_steps: MicroSteps,
               window: TrainWindow, logger: MetricLogger, bar: Any,
               validate: Callable[[Any], dict[str, float]], ckpts: ocp.CheckpointManager,
               meta: dict[str, Any], last_good: str, step_hook: Callable[[int], None] | None):
    self.micro_steps, self.window, self.logger, self.bar = micro_steps, window, logger, bar
    self.validate, self.ckpts, self.new_best = validate, ckpts, None
    self.best_metric, self.best_mode = eval_config.best_metric, eval_config.best_mode
    self.meta, self.last_good, self.step_hook = meta, last_good, step_hook
    self.parallel = micro_steps.parallel
    self.log_action = Periodic(logging.log_every, self._log)
    self.validate_action = Periodic(eval_config.eval_frequency, self._validate)
    self.checkpoint_action = Periodic(checkpoint.checkpoint_every, self._checkpoint)

  def __call__(self, step: int, state_repl: TrainState, stop: bool, final: bool) -> None:
    """The actions after optimizer ``step``. ``stop``: the run's last step of this start
    (record and checkpoint); ``final``: it ends training (validate too). A new best is saved
    at its step. The time after the record is left out of the train window's.

    Raises:
      errors.NonFiniteError: the step's metrics, the parameters or the validation loss are
        not finite (nothing of it logged, except the validation, or saved).
      errors.CheckpointError, errors.WriteError: a save or a record failed.
    """
    self.log_action(step, force=stop, state_repl=state_repl)
    pause_start = time.time()
    self.validate_action(step, force=final, state_repl=state_repl)
    self.checkpoint_action(step, force=stop or self.new_best is not None, state_repl=state_repl)
    self._hook(step)
    self.window.exclude(time.time() - pause_start)

  def _log(self, step: int, state_repl: TrainState) -> None:
    self.micro_steps.check_finite(state_repl, self.last_good)
    record = self.window.record(step)
    self.logger.write(step, record, "train")
    self.bar.set_postfix(loss=f"{record['loss']:.3f}", acc=f"{record['accuracy']:.3f}")
    self.window.restart()

  def _validate(self, step: int, state_repl: TrainState) -> None:
    self.micro_steps.check_finite(state_repl, self.last_good)
    val = self.validate(state_repl.params)
    self.logger.write(step, val, "val")
    if not math.isfinite(val["loss"]):
      raise errors.NonFiniteError(
          f"step {step}: the validation loss is {val['loss']}; the run stopped without "
          f"saving this state. The last good checkpoint is {self.last_good}.")
    # The majority rate of the examples the last validation read: saved with each checkpoint,
    # so a start that trains no step reports the same figure as the start that validated.
    self.meta["val_majority_rate"] = val["majority_rate"]
    self.bar.write(f"step {step}: val accuracy {val['accuracy']:.4f} loss {val['loss']:.4f}")
    score = best_score(val, self.best_metric, self.best_mode)
    if self.meta["best_score"] is None or score > self.meta["best_score"]:   # the first wins ties
      self.meta.update(best_score=score, best_step=step, best_val_accuracy=val["accuracy"])
      self.new_best = score

  def _checkpoint(self, step: int, state_repl: TrainState) -> None:
    self.micro_steps.check_finite(state_repl, self.last_good)
    self.meta["train_seconds"] = self.window.train_seconds
    save_checkpoint(self.ckpts, step, self.parallel.host(state_repl), self.meta, self.new_best)
    self.last_good, self.new_best = step_dir(self.ckpts, step), None

  def _hook(self, step: int) -> None:
    if self.step_hook is not None:
      finish_saves(self.ckpts)   # a hook sees the step's checkpoints on disk
      self.step_hook(step)
