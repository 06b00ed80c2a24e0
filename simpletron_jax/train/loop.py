"""The training loop's parts: one optimizer step, the train window and the periodic actions.

After each optimizer step (``grad_accum_steps`` micro-steps), :class:`Actions` runs, in order:
a train record every ``log_every`` steps, a validation every ``eval_frequency`` steps (a new
best saved at once), a checkpoint every ``checkpoint_every`` steps, and the step hook. The
run's last step forces the record and the checkpoint, and the validation unless a preemption
stopped it; nothing non-finite is logged or saved (:func:`check_finite`). Times are seconds.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Callable, Iterator

import jax
import numpy as np
import orbax.checkpoint as ocp

from simpletron_jax.runtime import distributed, errors, progress
from simpletron_jax.train import steps, train_state
from simpletron_jax.run import run_guard
from simpletron_jax.train.checkpoints import (
    RunState,
    best_score,
    finish_saves,
    save_checkpoint,
    step_dir,
)
from simpletron_jax.run.metric_logging import MetricLogger
from simpletron_jax.train.run_config import RunConfig
from simpletron_jax.train.steps import InFlightLimit, JitParallel, PmapParallel, TrainState


def check_finite(unchecked: list, state_repl: TrainState, last_good: str,
                 parallel: PmapParallel | JitParallel | None = None) -> None:
  """Checks the loss sums and ``grad_norm`` of ``unchecked`` (``(optimizer step, train step
  output)`` pairs) and the parameters of ``state_repl``; ``parallel`` defaults to pmap's.

  Raises:
    errors.NonFiniteError: naming the first non-finite step and ``last_good``.
  """
  parallel = parallel or PmapParallel()
  bad = run_guard.first_nonfinite(
      [(step, parallel.host({"loss": metrics["metrics"].loss.total,
                             "grad_norm": metrics["grad_norm"]})) for step, metrics in unchecked])
  # one host: checked on device, not copied to the host and back (78 MB for paper ListOps)
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
  """``callback_fn(step, **kwargs)`` at each multiple of ``every_steps`` and when forced: clu
  ``PeriodicCallback``'s rule, without clu's import of TensorFlow."""

  def __init__(self, every_steps: int, callback_fn: Callable[..., None]):
    self.every_steps, self.callback_fn = every_steps, callback_fn

  def __call__(self, step: int, force: bool = False, **kwargs) -> bool:
    """Returns whether the callback ran."""
    if force or step % self.every_steps == 0:
      self.callback_fn(step, **kwargs)
      return True
    return False


class TrainWindow:
  """The train record of the steps since the last one: metric means and throughput.

  Args:
    schedule: the learning-rate schedule, a function of the optimizer update count.
    train_seconds: the train seconds of the run's earlier starts (a checkpoint's).

  Attributes:
    train_seconds: seconds trained so far over all starts, without validations, checkpoints
      and the step hook (:meth:`exclude`), at the last record.
    compile_seconds_this_run, shapes_compiled: this start's train calls that compiled a new
      batch shape: their seconds and count.
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
    """The record of the window ending at ``step``: metric means over real examples (merged
    in float64 on the host), ``learning_rate``, throughput and compile time."""
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
  """One optimizer step as ``accum`` micro-steps; micro-step ``i`` of the run (from 0, over
  all starts) takes the next of ``batches`` and dropout key ``fold_in(dropout_root, i)``. At
  most :data:`steps.CALLS_IN_FLIGHT` calls are unfinished at once.

  Args:
    programs: ``{steps.batch_shape_key: compiled train step}`` (may be empty).

  Attributes:
    unchecked: ``(optimizer step, output)`` of the micro-steps not yet checked to be finite.
  """

  def __init__(self, p_train: Callable, programs: dict, parallel: PmapParallel | JitParallel,
               batches: Iterator, dropout_root: jax.Array, accum: int):
    self.p_train, self.programs, self.parallel = p_train, programs, parallel
    self.batches, self.dropout_root, self.accum = batches, dropout_root, accum
    self.seen = set(programs)   # precompiled shapes count as seen
    self.in_flight = InFlightLimit()
    self.unchecked: list = []

  def __call__(self, state_repl: TrainState, step: int, window: TrainWindow) -> TrainState:
    """Optimizer ``step`` (from 1); returns the new state, its metrics added to ``window``."""
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
    """:func:`check_finite` of the unchecked micro-steps, if any."""
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


@dataclasses.dataclass
class Saving:
  """Where the loop saves and what each checkpoint carries.

  Attributes:
    ckpts: the run's checkpoint manager.
    run_state: what a checkpoint carries (the best validation, ``train_seconds``, ...),
      updated in place.
    step: the newest checkpoint's optimizer step (0: none saved yet).
  """

  ckpts: ocp.CheckpointManager
  run_state: RunState
  step: int

  @property
  def last_good(self) -> str:
    """The newest checkpoint's folder, or a phrase saying none was saved."""
    return step_dir(self.ckpts, self.step) if self.step else "none (nothing saved yet)"


class Actions:
  """An optimizer step and the actions after it (the module docstring's order), with the
  train window (:class:`TrainWindow`) and the progress bar.

  Args:
    run: the run's typed config (its ``train``, ``eval``, ``checkpoint`` and ``logging``).
    micro_steps: the optimizer step (:class:`MicroSteps`).
    logger: the run's metric records.
    validate: ``validate(params_repl) -> metrics`` of the validation split.
    saving: the checkpoints, from the step the run starts at.
    step_hook: called with each optimizer step once its checkpoints are on disk, or None.
  """

  def __init__(self, run: RunConfig, micro_steps: MicroSteps, logger: MetricLogger,
               validate: Callable[[Any], dict[str, float]], saving: Saving,
               step_hook: Callable[[int], None] | None):
    self.micro_steps, self.logger, self.validate = micro_steps, logger, validate
    self.saving, self.step_hook, self.new_best = saving, step_hook, None
    self.best_metric, self.best_mode = run.eval.best_metric, run.eval.best_mode
    self.parallel = micro_steps.parallel
    self.window = TrainWindow(self.parallel, train_state.make_schedule(run.train),
                              saving.run_state.train_seconds)
    self.bar = progress.bar(total=run.train.num_train_steps, initial=saving.step, desc="train",
                            disable=jax.process_index() != 0, dynamic_ncols=True,
                            mininterval=1.0)
    self.log_action = Periodic(run.logging.log_every, self._log)
    self.validate_action = Periodic(run.eval.eval_frequency, self._validate)
    self.checkpoint_action = Periodic(run.checkpoint.checkpoint_every, self._checkpoint)

  def train_step(self, state_repl: TrainState, step: int) -> TrainState:
    """Optimizer ``step`` (:class:`MicroSteps`), counted in the window and the bar."""
    state_repl = self.micro_steps(state_repl, step, self.window)
    self.bar.update(1)
    return state_repl

  def close(self) -> None:
    """Closes the progress bar (its last line)."""
    self.bar.close()

  def write(self, line: str) -> None:
    """Writes ``line`` on its own line, past the progress bar."""
    self.bar.write(line)

  def __call__(self, step: int, state_repl: TrainState, stop: bool, final: bool) -> None:
    """``stop``: this start's last step (record, checkpoint); ``final``: also validate.

    Raises:
      errors.NonFiniteError: the step's metrics, parameters or validation loss.
      errors.CheckpointError, errors.WriteError: a save or a record failed.
    """
    self.log_action(step, force=stop, state_repl=state_repl)
    pause_start = time.time()
    self.validate_action(step, force=final, state_repl=state_repl)
    self.checkpoint_action(step, force=stop or self.new_best is not None, state_repl=state_repl)
    self._hook(step)
    self.window.exclude(time.time() - pause_start)

  def _log(self, step: int, state_repl: TrainState) -> None:
    self.micro_steps.check_finite(state_repl, self.saving.last_good)
    record = self.window.record(step)
    self.logger.write(step, record, "train")
    self.bar.set_postfix(loss=f"{record['loss']:.3f}", acc=f"{record['accuracy']:.3f}")
    self.window.restart()

  def _validate(self, step: int, state_repl: TrainState) -> None:
    self.micro_steps.check_finite(state_repl, self.saving.last_good)
    val = self.validate(state_repl.params)
    self.logger.write(step, val, "val")
    if not math.isfinite(val["loss"]):
      raise errors.NonFiniteError(
          f"step {step}: the validation loss is {val['loss']}; the run stopped without "
          f"saving this state. The last good checkpoint is {self.saving.last_good}.")
    # saved with each checkpoint: a start that trains no step reports the same figure
    self.saving.run_state.val_majority_rate = val["majority_rate"]
    self.bar.write(f"step {step}: val accuracy {val['accuracy']:.4f} loss {val['loss']:.4f}")
    score = best_score(val, self.best_metric, self.best_mode)
    if self.saving.run_state.new_best(step, score, val["accuracy"]):
      self.new_best = score

  def _checkpoint(self, step: int, state_repl: TrainState) -> None:
    self.micro_steps.check_finite(state_repl, self.saving.last_good)
    saving = self.saving
    saving.run_state.train_seconds = self.window.train_seconds
    save_checkpoint(saving.ckpts, step, self.parallel.host(state_repl),
                    saving.run_state.to_meta(), self.new_best)
    saving.step, self.new_best = step, None

  def _hook(self, step: int) -> None:
    if self.step_hook is not None:
      finish_saves(self.saving.ckpts)   # a hook sees the step's checkpoints on disk
      self.step_hook(step)
