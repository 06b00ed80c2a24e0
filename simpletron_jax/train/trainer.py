"""``train_and_evaluate``: a run from its checks and setup through the loop to its tests.

The recipe is LRA's ``utils/train_utils.py`` and ``listops/train.py`` (Tay et al., 2020) with
optax AdamW, seeded data order, batches padded to a length bucket, metrics summed over real
examples, resumable orbax checkpoints, and tests of the final parameters (LRA's protocol) and
of the best-validation checkpoint (SimpleTRON's). A *step* is one optimizer update on
``batch_size`` examples, made of ``grad_accum_steps`` micro-steps (``optax.MultiSteps``).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Callable

import jax
import ml_collections

from simpletron_jax.data import batches, tasks
from simpletron_jax.runtime import distributed, errors
from simpletron_jax.train import (
    checkpoint_faults,
    checkpoints,
    config_checks,
    final_test,
    loop,
    precompile,
    saved_runs,
    train_state,
)
from simpletron_jax.run import (
    metric_logging,
    preemption,
    profiling,
    run_record,
    software_record,
)
from simpletron_jax.data.common import report_split_truncation
from simpletron_jax.run.run_folder import RunFolder
from simpletron_jax.train.run_config import RunConfig, TrainConfig
from simpletron_jax.train.steps import JitParallel, PmapParallel, TrainState, make_parallel


def _check_start(config: ml_collections.ConfigDict, workdir: str,
                 precompile_workers: int) -> tuple[RunConfig, RunFolder]:
  """The run's typed config and folder, created (:meth:`RunFolder.create`); raises ValueError
  for ``precompile_workers < 0`` or an inconsistent config."""
  if precompile_workers < 0:
    raise ValueError(f"--precompile_workers={precompile_workers} must be >= 0 (0: off)")
  run = RunConfig.from_config_dict(config, jax.device_count(), jax.process_count())
  folder = RunFolder(workdir, jax.process_index(), jax.process_count())
  folder.create()
  return run, folder


def _load_data(config: ml_collections.ConfigDict, run: RunConfig,
               data: tasks.TaskData | None) -> tasks.TaskData:
  """``data`` (None: loaded from ``run.data``), checked alike on every host; raises ValueError
  for an empty split or hosts that disagree (:func:`distributed.check_hosts_agree`)."""
  data = data or tasks.load_task(run.data)
  distributed.check_hosts_agree(distributed.config_fingerprint(config), data)
  config_checks.check_splits(data, run.batches, run.data.data_dir)
  if jax.process_index() == 0:   # loaders that truncate while loading report there
    for name in ("train", "val", "test"):
      report_split_truncation(name, getattr(data, name), run.model.max_length)
  return data


@dataclasses.dataclass
class _Start:
  """Where one start of a run begins (:func:`_resume`).

  Attributes:
    state, step: the unreplicated train state at the optimizer step resumed from (0: new).
    run_state: what the checkpoint carried (the best validation, ``train_seconds``, ...).
    config_tree: ``config.json``'s contents (:func:`run_record.config_with_history`).
    new_forced: this start forces a change that ``config.json``'s history lacks.
  """
  state: TrainState
  run_state: checkpoints.RunState
  step: int
  ckpts: Any
  folder: RunFolder
  config_tree: dict[str, Any]
  new_forced: bool
  dropout_root: jax.Array


def _no_intact_step(folder: RunFolder) -> str:
  """What a start that finds no intact checkpoint says: where the damaged steps went and the
  flag that trains again from step 0 (``train.py --start_over``)."""
  return (f"no intact checkpoint is left in {folder.checkpoints_dir}: the damaged steps were "
          f"moved to {folder.damaged_dir} ({', '.join(folder.damaged_checkpoints())}). Rerun "
          "with --start_over to train again from step 0 (damaged/ is kept), or put an intact "
          "copy of the checkpoints back")


def _resume(config: ml_collections.ConfigDict, run: RunConfig, folder: RunFolder,
            data: tasks.TaskData, allow_resume_changes: bool, start_over: bool = False
            ) -> _Start:
  """The model and its state, restored from the newest intact checkpoint (a damaged one is
  moved to ``damaged/``), or for a new run started from ``init_from``. A run whose every step
  was moved to ``damaged/`` starts from step 0 only with ``start_over``.

  Raises:
    errors.ConfigMismatchError: other settings (:func:`run_record.check_resume`), or a
      checkpoint of an earlier release (:data:`checkpoints.FORMAT`).
    errors.CheckpointError: no checkpoint is intact (without ``start_over``: also when every
      step was set aside before, naming ``--start_over``).
  """
  model = train_state.build_model(run, data)
  init_rng, dropout_root = jax.random.split(jax.random.PRNGKey(int(run.train.seed)))
  state = train_state.create_train_state(run.train, model, init_rng, run.model.max_length)
  ckpts = checkpoints.checkpoint_manager(folder.checkpoints_dir, run.checkpoint.max_to_keep,
                                         async_save=run.checkpoint.async_checkpoints)
  distributed.check_same_checkpoints(ckpts.all_steps(), str(ckpts.directory))
  run_state, start_step = checkpoints.RunState(), 0
  previous_config = folder.read_config()   # before this start overwrites it
  record = run_record.run_record(config, vocab_size=data.vocab_size,
                                 num_classes=data.num_classes, num_devices=jax.device_count(),
                                 num_hosts=jax.process_count(),
                                 data_sha256=distributed.data_fingerprint(data))
  changes = []   # this start's changes from the checkpoint's settings (config history)

  def resume_check(where: str, saved_meta: dict, model_diff: list[str]) -> None:
    changes[:] = run_record.check_resume(where, saved_meta[run_record.RECORD_KEY], record,
                                         model_diff=model_diff,
                                         allow_changes=allow_resume_changes)

  if not ckpts.all_steps() and folder.damaged_checkpoints() and not start_over:
    raise errors.CheckpointError(_no_intact_step(folder))
  if ckpts.all_steps():
    try:
      state, meta, start_step = checkpoints.restore_checkpoint(
          ckpts, state, model_config=config.model, quarantine_dir=folder.damaged_dir,
          resume_check=resume_check)
    except errors.CheckpointError as e:
      if ckpts.all_steps() or not folder.damaged_checkpoints():
        raise
      raise errors.CheckpointError(_no_intact_step(folder)) from e
    run_state = checkpoints.RunState.from_meta(meta)
    print(f"Resumed from {folder.checkpoints_dir} at step {start_step}", file=sys.stderr)
    if changes:
      print(f"Settings changed since the checkpoint (recorded in {folder.config_path}): "
            + "; ".join(run_record.describe_change(c) for c in changes), file=sys.stderr)
  else:
    state = saved_runs.apply_init_from(run.train, state, folder)
  run_state.run_id = folder.run_id(run_state.run_id)
  run_state.model_config = checkpoints.model_config_dict(config.model)
  run_state.run_record = record
  run_state = checkpoints.check_best(ckpts, run_state)
  history = (previous_config or {}).get(run_record.CONFIG_HISTORY_KEY, [])
  config_tree = run_record.config_with_history(config, history, changes, start_step)
  new_forced = (any(not c["allowed"] for c in changes)   # not yet in config.json's history
                and len(config_tree.get(run_record.CONFIG_HISTORY_KEY, [])) > len(history))
  return _Start(state, run_state, start_step, ckpts, folder, config_tree, new_forced,
                dropout_root)


def _write_config(start: _Start) -> dict[str, Any]:
  """Writes ``config.json`` (process 0) with ``software`` (:func:`software_record.software`),
  which it returns; raises ``errors.WriteError``."""
  software = software_record.software(jax.devices()[0].device_kind, jax.device_count(),
                                      jax.process_count())
  start.folder.write_config({**start.config_tree, run_record.SOFTWARE_KEY: software})
  return software


def _open_logs(config: ml_collections.ConfigDict, run: RunConfig,
               start: _Start) -> metric_logging.MetricLogger:
  """The run's logs opened at ``start.step``, with the parameter count and overview; removes a
  ``results.json`` this start trains past. Raises ``errors.WriteError`` (the file named)."""
  logger = metric_logging.MetricLogger(
      start.folder.workdir, resume_step=start.step, enabled=start.folder.writer,
      hparams=metric_logging.flat_config(config), wandb=run.logging.wandb,
      run_id=start.run_state.run_id)
  if start.step < run.train.num_train_steps:
    start.folder.drop_results(start.step)
  logger.write(start.step, {"params": sum(x.size for x in
                                          jax.tree_util.tree_leaves(start.state.params))},
               "info")
  logger.write_parameter_overview(start.state.params)   # stderr and parameter_overview.txt
  return logger


def _compile(run: RunConfig, data: tasks.TaskData, state_repl: TrainState,
             parallel: PmapParallel | JitParallel, start_step: int, workers: int,
             guard: preemption.PreemptionGuard) -> tuple[Callable, Callable, dict, dict]:
  """The run's train and eval steps; with ``workers > 0``, every batch shape's compiled first
  (:func:`precompile.precompile_steps`).

  Returns:
    ``(p_train, eval_fn, programs, precompiled)``: ``programs`` maps
    :func:`steps.batch_shape_key` to a compiled train step, ``precompiled`` holds
    ``precompile_seconds`` and the shape counts (both empty without ``workers``).

  Raises:
    preemption.PreemptedError: a signal came while compiling.
  """
  p_train, p_eval = parallel.steps(state_repl.apply_fn)
  if not workers:
    return p_train, p_eval, {}, {}
  try:
    train_steps, eval_fn, precompiled = precompile.precompile_steps(
        p_train, p_eval, state_repl, data, run, start_step * run.train.grad_accum_steps,
        workers, parallel,
        should_stop=guard.requested_locally)
  except precompile.Stopped:   # the compile threads were cancelled by the signal below
    pass
  if guard.requested_locally():   # nothing trained since the checkpoint: nothing to save
    raise preemption.PreemptedError(start_step, guard.cause)
  print(f"precompiled {precompiled['precompiled_train_shapes']} train and "
        f"{precompiled['precompiled_eval_shapes']} eval step shapes in "
        f"{precompiled['precompile_seconds']:.1f} s ({workers} threads)", file=sys.stderr)
  return p_train, eval_fn, train_steps.compiled, precompiled


def _release(guard: preemption.PreemptionGuard, profiler: profiling.StepProfiler | None,
             logger: metric_logging.MetricLogger | None, folder: RunFolder,
             ckpts: checkpoints.Manager | None = None) -> None:
  """Lets go, on every exit, of the signal handlers, orbax's save threads (a save still
  writing when an error or a second signal ends the run:
  :func:`checkpoint_faults.abandon_save`), the profiler, the logs (a failure to close them is
  dropped, not to hide an error) and the workdir lock."""
  guard.restore()
  if ckpts is not None:
    checkpoint_faults.abandon_save(ckpts, getattr(ckpts, "pending", None))
  if profiler is not None:
    profiler.close()
  try:
    if logger is not None:
      logger.close()   # a no-op after a success
  except errors.WriteError:
    pass
  folder.unlock()


def _train_steps(train: TrainConfig, first: int, state_repl: TrainState, actions: loop.Actions,
                 profiler: profiling.StepProfiler, guard: preemption.PreemptionGuard,
                 wall_start: float) -> tuple[TrainState, int, bool, bool]:
  """Optimizer steps from ``first`` until ``num_train_steps``, ``max_train_minutes`` or a
  signal; returns ``(state_repl, step, preempted, out_of_time)``, ``step`` the last one."""
  budget = loop.TimeBudget(train.max_train_minutes, wall_start)
  step, preempted, out_of_time = train.num_train_steps, False, False   # if none is trained
  for step in range(first, train.num_train_steps + 1):
    profiler.step_started(step)   # --profile_steps: the trace starts before step A
    state_repl = actions.train_step(state_repl, step)
    profiler.step_finished(step, state_repl)   # after step B: wait for it, stop the trace
    out_of_time = budget.spent()
    preempted = guard.should_stop(step)   # every host at the same step
    final = step == train.num_train_steps or out_of_time   # validates, as a straight run
    actions(step, state_repl, stop=final or preempted, final=final)
    if preempted or out_of_time:
      break
  return state_repl, step, preempted, out_of_time


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       step_hook: Callable[[int], None] | None = None,
                       data: tasks.TaskData | None = None, precompile_workers: int = 0,
                       allow_resume_changes: bool = False,
                       profile_steps: tuple[int, int] | None = None,
                       start_over: bool = False) -> dict[str, Any]:
  """Trains, validates every ``eval_frequency`` steps, then tests the final and best
  parameters (LRA ``listops/train.py``); resuming and rerunning: docs/runs.md.

  Args:
    config: the run config (``configs/``).
    workdir: the run's folder, created if missing; its newest checkpoint is resumed.
    step_hook: called with each optimizer step once its checkpoints are on disk (tests).
    data: preloaded task data; None: loaded from ``config``.
    precompile_workers: threads that compile every batch shape's steps first; 0: none.
    allow_resume_changes: resume despite changed settings (never ``model.*``), recorded.
    profile_steps: ``(A, B)``: a profiler trace of steps A..B to ``workdir/profile``.
    start_over: train from step 0 when every checkpoint was moved to ``damaged/``.

  Returns:
    ``results.json``'s contents (:class:`final_test.Results`): ``test_accuracy_best_val``,
    ``test_accuracy_final``, their ``best_step`` and ``final_step``, ``complete``, ... (all in
    docs/runs.md); for a finished rerun, the file as it is (an older one may have the alias
    keys ``test_accuracy``, ``test_loss`` and ``last_step``).

  Raises:
    ValueError: an inconsistent config or an empty split.
    NotADirectoryError: ``workdir`` is a file.
    errors.WorkdirLockedError: another run holds ``workdir``.
    errors.ConfigMismatchError: the checkpoint was computed with other settings.
    errors.CheckpointError: a save failed, or no checkpoint is intact (and not
      ``start_over``).
    errors.NonFiniteError: a loss, gradient norm or parameter became NaN or inf.
    errors.WriteError: a log, ``results.json`` or ``transfer.json`` could not be written.
    preemption.PreemptedError: SIGTERM or SIGINT: the last step saved, nothing tested.
  """
  wall_start = time.time()
  run, folder = _check_start(config, workdir, precompile_workers)
  train = run.train
  folder.lock()
  logger = profiler = start = None
  guard = preemption.PreemptionGuard()   # SIGTERM/SIGINT: save (if trained) and stop
  try:   # from here on every exit releases the lock (the `finally` below)
    data = _load_data(config, run, data)
    guard.install()   # a signal from here on stops the run where it can stop cleanly
    start = _resume(config, run, folder, data, allow_resume_changes, start_over)
    if start.step >= train.num_train_steps and not start.new_forced:
      problem = (run_record.workdir_results_problem(workdir, config, count_forced=True)
                 if folder.writer else None)   # process 0 decides
      finished = folder.finished_results(problem, start.step, distributed.agree_on_flag)
      if finished is not None:   # a finished rerun
        return finished
    software = _write_config(start)
    earlier = folder.earlier_records(start.step)
    if guard.requested_locally():   # a signal while building or restoring: nothing to save
      raise preemption.PreemptedError(start.step, guard.cause)
    logger = _open_logs(config, run, start)
    profiler = profiling.StepProfiler(
        folder.profile_dir,
        profiling.check_profile_steps(profile_steps, train.num_train_steps), start.step,
        enabled=jax.process_index() == 0)
    parallel = make_parallel(train.parallelism)
    state_repl = parallel.put_state(start.state)
    p_train, eval_fn, programs, precompiled = _compile(
        run, data, state_repl, parallel, start.step, precompile_workers, guard)
    if precompiled:
      logger.write(start.step, precompiled, "info")
    micro_steps = loop.MicroSteps(
        p_train, programs, parallel,
        batches.train_batches(data.train, run.batches, start.step * train.grad_accum_steps),
        start.dropout_root, train.grad_accum_steps)
    actions = loop.Actions(
        run, micro_steps, logger,
        final_test.evaluator(eval_fn, data.val, run.batches, run.eval.num_eval_steps, parallel),
        loop.Saving(start.ckpts, start.run_state, start.step), step_hook)
    state_repl, step, preempted, out_of_time = _train_steps(
        train, start.step + 1, state_repl, actions, profiler, guard, wall_start)
    guard.restore()   # from here on, a signal ends the process: the last step is saved
    actions.close()
    checkpoints.finish_saves(start.ckpts)   # on disk, or CheckpointError
    if preempted or guard.requested_locally():   # no test: the scheduler's grace period is short
      actions.write(f"{guard.cause}: saved step {step} to {actions.saving.last_good}")
      logger.close()
      raise preemption.PreemptedError(step, guard.cause)
    if out_of_time:
      actions.write(f"max_train_minutes={train.max_train_minutes} reached after step {step}; "
                    "rerun with the same workdir to continue")
    tests = final_test.final_and_best_tests(
        start, earlier, logger,
        final_test.evaluator(eval_fn, data.test, run.batches, run.eval.num_test_steps, parallel),
        state_repl.params, parallel, step)
    val_majority = start.run_state.val_majority_rate
    if val_majority is None:   # this lineage has not validated yet
      val_majority = final_test.last_val_majority(earlier, step, data.val)
    results = final_test.run_results(
        run, start, final_test.Tests(*tests, val_majority, step), actions.window,
        final_test.RunFacts(run_record.config_fingerprint(config), data.source, software,
                            precompiled, wall_start)).to_json()
    folder.write_results(results)   # atomic: never a half-written file
    logger.close()
    return results
  finally:   # also on errors and preemption: no handler, open file or lock is left behind
    _release(guard, profiler, logger, folder, start.ckpts if start is not None else None)
