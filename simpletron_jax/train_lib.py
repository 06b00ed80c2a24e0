"""Training and evaluation: the optimizer and train state, the loop, and checkpoint evaluation.

The recipe follows LRA ``utils/train_utils.py`` and ``listops/train.py``
(Tay et al., 2020), with these changes: optax AdamW instead of flax.optim,
seeded data order, batches padded to a length bucket instead of to
``max_length``, metrics as sums over real examples, orbax checkpoints that a
killed run resumes from, and test evaluations of both the final parameters
(LRA's protocol) and the best-validation checkpoint (SimpleTRON's).

Units: a *step* is one optimizer update on ``config.batch_size`` examples; with
``config.grad_accum_steps = A`` it is made of A *micro-steps* of
``batch_size / A`` examples each (``optax.MultiSteps``).

The parts the loop is made of have a module each: :mod:`simpletron_jax.steps` (loss, pmapped
steps, replication), :mod:`simpletron_jax.batches` (data order), :mod:`simpletron_jax.evaluation`,
:mod:`simpletron_jax.checkpoints`, :mod:`simpletron_jax.config_checks` (:func:`validate_config`)
and :mod:`simpletron_jax.run_record` (``config.json``, :func:`load_run_config`). Their public
names stay importable from here, as ``train_lib.<name>``, for the scripts, benchmarks and tests
that use them.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import ml_collections
import optax

from simpletron_jax import (atomic_io, checkpoints, cli, config_checks, distributed, errors,
                            lora, models, precompile, preemption, profiling, progress,
                            run_guard, run_record, schedules, steps, tasks, transfer)
from simpletron_jax.batches import train_batches
from simpletron_jax.checkpoints import (check_async_supported, checkpoint_manager,
                                        finish_saves, model_config_dict, prune_best,
                                        reconcile_best, restore_checkpoint, save_checkpoint,
                                        step_dir)
from simpletron_jax.config_checks import validate_config
from simpletron_jax.data.common import PairedExamples, report_split_truncation
from simpletron_jax.evaluation import evaluate
from simpletron_jax.metric_logging import MetricLogger, read_records
from simpletron_jax.run_record import config_with_history, load_run_config, read_config_json
from simpletron_jax.steps import (InFlightLimit, JitParallel, PmapParallel, TrainState,
                                  batch_shape_key, make_parallel)

# Re-exported: scripts, benchmarks and tests use these as train_lib.<name>.
from simpletron_jax.batches import (batch_width, eval_batch_size, eval_batches,  # noqa: F401
                                    eval_index_batches, host_batch, train_index_batches)
from simpletron_jax.steps import (AXIS, CALLS_IN_FLIGHT, Batch, eval_step,  # noqa: F401
                                  loss_fn, metric_sums, pmap_steps, replicate, shard,
                                  train_step, unreplicate)


# ----------------------------------------------------------------------------
# Optimizer and state.


def make_schedule(config: ml_collections.ConfigDict) -> Callable:
  """The learning-rate schedule of ``config`` (steps are optimizer updates)."""
  return schedules.create_learning_rate_schedule(
      factors=config.factors, base_learning_rate=config.learning_rate,
      warmup_steps=config.warmup, steps_per_cycle=config.num_train_steps)


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """AdamW with LRA's decoupled decay ``p -= lr * wd * p`` on every parameter.

  Preceded by global-norm gradient clipping when ``config.grad_clip_norm > 0`` (LRA's
  Path-X recipe). Parameters matching a ``config.freeze`` regex, and the base parameters
  of a LoRA run (``config.lora.rank > 0``), get zero updates (:func:`transfer.freeze`).
  Wrapped in ``optax.MultiSteps`` when ``config.grad_accum_steps > 1``, so the schedule
  advances once per optimizer update.
  """
  tx = optax.adamw(make_schedule(config), b1=config.adam_b1, b2=config.adam_b2,
                   eps=config.adam_eps, weight_decay=config.weight_decay)
  clip = float(config.get("grad_clip_norm", 0.0) or 0.0)
  if clip > 0:
    tx = optax.chain(optax.clip_by_global_norm(clip), tx)
  frozen = tuple(config.get("freeze", ()) or ())
  if config.get("lora", {}).get("rank", 0) > 0:
    frozen += (f"^{lora.BASE}/",)
  if frozen:
    tx = transfer.freeze(tx, frozen)
  if config.grad_accum_steps > 1:
    tx = optax.MultiSteps(tx, every_k_schedule=config.grad_accum_steps)
  return tx


def create_train_state(config: ml_collections.ConfigDict, model: flax.linen.Module,
                       rng: jax.Array) -> TrainState:
  """Initialises parameters and optimizer state (unreplicated).

  Args:
    config: the run config.
    model: a :class:`simpletron_jax.models.ClassificationEncoder`.
    rng: the parameter-init key.

  Returns:
    A TrainState at step 0. With ``config.lora.rank > 0`` its params are the LoRA tree
    ``{"base", "lora"}`` and its ``apply_fn`` merges them (:mod:`simpletron_jax.lora`).
  """
  length = min(config.model.max_length, 16)
  tokens = jnp.ones((1, length), jnp.int32)
  second = (tokens, None) if isinstance(model, models.DualEncoderClassifier) else ()
  params = jax.jit(lambda r: model.init({"params": r}, tokens, None, *second,
                                        deterministic=True))(rng)["params"]
  apply_fn, rank = model.apply, config.get("lora", {}).get("rank", 0)
  if rank > 0:
    params = lora.wrap(params, config.lora.targets, rank, jax.random.fold_in(rng, 0x10A))
    apply_fn = lora.wrap_apply(model.apply, lora.scale_of(rank, config.lora.alpha))
  return TrainState.create(apply_fn=apply_fn, params=params, tx=make_optimizer(config))


# ----------------------------------------------------------------------------
# The loop.


def check_finite(unchecked: list, state_repl: TrainState, last_good: str,
                 parallel: PmapParallel | JitParallel | None = None) -> None:
  """Stops a run whose training went non-finite, before anything is logged or saved.

  Args:
    unchecked: ``(optimizer step, metrics)`` of the micro-steps since the last check, as
      returned by the pmapped train step (``loss`` sums and ``grad_norm``).
    state_repl: the state after the last of them, as the steps return it.
    last_good: the newest checkpoint saved, for the message.
    parallel: the run's :func:`steps.make_parallel` (default: pmap's).

  Raises:
    errors.NonFiniteError: naming the first step whose loss or gradient norm is NaN or
      inf (or the last step, when only the parameters are), and ``last_good``.
  """
  parallel = parallel or PmapParallel()
  bad = run_guard.first_nonfinite(
      [(step, parallel.host(metrics)) for step, metrics in unchecked])
  if bad is None and not run_guard.tree_is_finite(parallel.host(state_repl.params)):
    bad = (unchecked[-1][0] if unchecked else -1, {"params": float("nan")})
  if bad is not None:
    step, values = bad
    shown = ", ".join(f"{k} {v}" for k, v in values.items())
    raise errors.NonFiniteError(
        f"step {step}: training became non-finite ({shown}). The run stopped without saving "
        f"this state; the last good checkpoint is {last_good}. Lower learning_rate, raise "
        "warmup or set grad_clip_norm, then resume or start a new workdir.")


def build_model(config: ml_collections.ConfigDict, data: tasks.TaskData):
  """The classifier for ``config.model`` sized to ``data``; with a ``config.pretrain``
  section (the ``:spt`` / ``:spt_ft`` configs), the self-pretraining LM model or the
  fine-tuning classifier with the [MASK] row reserved (:func:`pretraining.build_model`)."""
  if config.get("pretrain") is not None:
    from simpletron_jax import pretraining  # pylint: disable=import-outside-toplevel
    return pretraining.build_model(config, vocab_size=data.vocab_size,
                                   num_classes=data.num_classes,
                                   dual=isinstance(data.train, PairedExamples))
  return models.build_classifier(config.model, vocab_size=data.vocab_size,
                                 num_classes=data.num_classes,
                                 dual=isinstance(data.train, PairedExamples))


def apply_init_from(config: ml_collections.ConfigDict, state: TrainState,
                    workdir: str) -> TrainState:
  """Starts ``state`` from ``config.init_from``'s best checkpoint (weight surgery).

  Copies every parameter whose path and shape the source run shares with this model (only
  those matching ``config.init_include`` when set; :func:`transfer.transfer_params`) and
  writes what was copied, newly initialised and dropped to ``workdir/transfer.json``.

  Returns:
    ``state`` unchanged when ``config.init_from`` is empty, else with the new params.

  Before any parameter is copied, the source checkpoint is checked as a resumed or evaluated
  one is: its arrays load, match their CRC-32 and are finite
  (:func:`checkpoints.verify_params_checkpoint`).

  Raises:
    FileNotFoundError, ValueError: see :func:`transfer.init_from_config`.
    errors.CheckpointError: the source checkpoint is damaged (named).
    errors.WriteError: ``transfer.json`` could not be written (named).
  """
  best = os.path.join(str(config.get("init_from") or ""), "best")
  if config.get("init_from") and os.path.isdir(best):   # else transfer names what is missing
    checkpoints.verify_params_checkpoint(best, f"init_from={config.init_from!r}")
  params, report = transfer.init_from_config(config, state.params)
  if report is None:
    return state
  print(f"init_from {config.init_from}: {report.summary()}", file=sys.stderr)
  if jax.process_index() == 0:
    atomic_io.write_json_atomic(os.path.join(workdir, "transfer.json"),
                                {"init_from": config.init_from, **report.to_dict()})
  return state.replace(params=params)


def _earlier_records(path: str, start_step: int) -> dict[tuple[int, str], dict[str, Any]]:
  """``{(step, split): record}`` of the ``val``, ``test`` and ``test_final`` records of
  ``metrics.jsonl`` at or before ``start_step`` (the last of each), which a start resumed at
  ``start_step`` keeps; empty for a fresh start or a missing file.

  Raises:
    ValueError: ``path:line:`` for a damaged line (:func:`metric_logging.read_records`).
  """
  if start_step <= 0 or not os.path.exists(path):
    return {}
  return {(r["step"], r["split"]): r for r in read_records(path)
          if r["step"] <= start_step and r.get("split") in ("val", "test", "test_final")}


def _test_metrics(earlier: dict, logger: MetricLogger, step: int, split: str,
                  compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
  """The ``split`` (``test`` or ``test_final``) metrics of ``step``: the record an earlier
  start wrote (:func:`_earlier_records`), or ``compute()`` written as a new record.

  The parameters of a step are the same at every start (a resumed run is bit-identical), so
  a recorded test is the one ``compute`` would give; reusing it keeps ``metrics.jsonl`` free
  of a second record of the same ``(step, split)``. On several hosts the evaluation is a
  collective that every host must join, so it always runs there, and only an unrecorded
  result is written.
  """
  recorded = earlier.get((step, split))
  if recorded is not None and jax.process_count() == 1:
    return {k: v for k, v in recorded.items() if k not in ("step", "split", "time")}
  metrics = compute()
  if recorded is None:
    logger.write(step, metrics, split)
  return metrics


def _last_val_majority(earlier: dict, step: int, val: Any) -> float:
  """The majority-class rate of the last validation at or before ``step`` as recorded in
  ``metrics.jsonl`` (for a checkpoint saved before checkpoints carried it), else of the whole
  validation split."""
  recorded = [r for (s, split), r in sorted(earlier.items()) if split == "val" and s <= step]
  if recorded and recorded[-1].get("majority_rate") is not None:
    return float(recorded[-1]["majority_rate"])
  return val.majority_rate()


def _finished_results(workdir: str, config: ml_collections.ConfigDict) -> dict[str, Any] | None:
  """``workdir/results.json`` when it is the finished result of ``config``
  (:func:`run_record.workdir_results_problem`; a run resumed with forced changes counts here,
  as this start repeats it), else None. Process 0 decides for every host.

  Raises:
    OSError, ValueError: another host cannot read the file process 0 found (the workdir
      must be shared, as the checkpoints are).
  """
  problem = (run_record.workdir_results_problem(workdir, config, count_forced=True)
             if jax.process_index() == 0 else None)
  if not distributed.agree_on_flag(problem is None):
    return None
  with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
    return json.load(f)


def make_workdir(workdir: str) -> None:
  """Creates ``workdir`` (and its parents) unless it exists as a folder.

  Raises:
    NotADirectoryError: ``workdir`` (or a folder on its path) is a file; names it.
    OSError: of the same type, naming ``workdir``, when it cannot be created (permissions).
    ValueError: its name is not UTF-8 text (:func:`cli.check_path_name`).
  """
  cli.check_path_name(workdir, "--workdir")
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise NotADirectoryError(f"--workdir {workdir!r} is a file, not a folder: pass a folder "
                             "(created if missing) or move the file away")
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise type(e)(f"--workdir {workdir!r} cannot be created: {e.strerror or e} "
                  f"({e.filename or workdir}); pass a folder in a writable place") from e


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       step_hook: Callable[[int], None] | None = None,
                       data: tasks.TaskData | None = None,
                       precompile_workers: int = 0,
                       allow_resume_changes: bool = False,
                       profile_steps: tuple[int, int] | None = None) -> dict[str, Any]:
  """Trains, evaluates every ``eval_frequency`` steps, then tests the final and best parameters.

  Resumes from the newest checkpoint in ``workdir/checkpoints`` if there is
  one, and continues exactly as an uninterrupted run would (same data order,
  dropout keys and optimizer state). Writes ``workdir/metrics.jsonl``,
  TensorBoard events in ``workdir/tb`` (and a W&B run under ``workdir/wandb`` when
  ``config.wandb.project`` is set; :class:`MetricLogger`), ``workdir/config.json``,
  ``workdir/parameter_overview.txt`` (also printed to stderr) and, at the
  end, ``workdir/results.json``.

  Before any work every field is validated (:func:`validate_config`,
  :func:`config_checks.check_settings`), and truncation by ``model.max_length`` is reported once
  per split. A resumed checkpoint must have been computed with this config's settings, data,
  vocabulary and class count, and device and host counts (:func:`run_record.check_resume`;
  the checkpoint meta holds them as ``run_record``); the changes let through
  (:data:`run_record.RESUME_ALLOWED_FIELDS`, or any but ``model.*`` with
  ``allow_resume_changes``) are appended to ``config.json``'s ``config_history`` (see
  :func:`config_with_history`) instead of being overwritten. A checkpoint saved before run
  records resumes with a warning, compared with the previous ``config.json`` only.

  A rerun of a finished run changes nothing: when the checkpoint resumed is at
  ``num_train_steps``, no change was forced and ``results.json`` is the finished result of
  this config, that ``results.json`` is returned and no file is written. Otherwise a test an
  earlier start recorded in ``metrics.jsonl`` (a run killed while testing) is reused rather
  than repeated and recorded twice, and ``val_majority_rate`` is that of the last validation,
  which checkpoints carry, whichever start reaches the end.

  Args:
    config: the run config (see ``configs/``).
    workdir: output directory; created if missing.
    step_hook: called with the optimizer step after each step and its
      checkpoint (tests use it to simulate a kill).
    data: preloaded task data; loaded from ``config`` when None.
    precompile_workers: if > 0, the train and eval steps of every batch shape the run will
      meet are compiled before the loop, in this many threads side by side
      (:mod:`simpletron_jax.precompile`); 0 compiles each shape when the loop first meets it.
    allow_resume_changes: resume even though settings that change what is computed differ
      from the checkpoint's (train.py ``--allow_resume_changes``); the changes are recorded
      in ``config.json``'s ``config_history``. ``model.*`` changes stay refused.
    profile_steps: ``(A, B)``: a JAX profiler trace of optimizer steps A..B (both included,
      ``1 <= A <= B <= num_train_steps``) is written to ``workdir/profile`` by process 0
      (:class:`profiling.StepProfiler`; train.py ``--profile_steps=A:B``); a run resumed at
      or past step A traces nothing. None: no trace.

  Returns:
    The contents of ``results.json``: test accuracy and loss under two protocols,
    ``test_{accuracy,loss}_best_val`` for the best-validation checkpoint (its step
    ``best_step``, its ``best_val_accuracy``; SimpleTRON's protocol; also kept as
    ``test_accuracy``/``test_loss``) and ``test_{accuracy,loss}_final`` for the
    parameters after ``final_step`` (LRA's ``--test_only`` protocol), the
    majority-class rates of the val and test examples evaluated, steps/s and wall time in
    seconds, the seconds the loop spent compiling train steps (one per batch shape met that
    had no program yet, ``train_shapes_compiled_in_loop``), and with ``precompile_workers``
    the ``precompile_seconds`` and counts of :func:`precompile.precompile_steps`. Each train
    record of ``metrics.jsonl`` has ``compile_seconds`` and ``new_shapes`` of its window and
    ``steps_per_sec_excluding_compile``. ``final_step``, ``complete`` (False when
    ``max_train_minutes`` stopped the run before ``num_train_steps``, with ``stopped_by``)
    and ``config_fingerprint`` (:func:`run_record.config_fingerprint`) say what the numbers
    describe; a run that trains on past an existing ``results.json`` deletes it first.
    ``forced_resume_changes`` (:func:`run_record.forced_changes`) lists the starts that
    ``allow_resume_changes`` let change what is computed (empty: none), and the
    :func:`run_record.software` fields (versions, ``device_kind``, ``device_count``,
    ``process_count``, ``git_commit``) what computed it; ``config.json`` holds the latter
    under ``software``. Neither enters ``config_fingerprint``.

  Faults are never silent (docs/faults.md, "When things go wrong"): ``workdir/run.lock`` keeps a
  second run out; a checkpoint that fails verification is moved to ``workdir/damaged`` and
  the run resumes from the newest intact one; ``best/`` only ever holds checkpoints of this
  run's lineage (``workdir/run_id``, see :func:`reconcile_best`); ``results.json`` and
  ``metrics.jsonl`` are strict JSON (non-finite values are ``null``).

  Raises:
    ValueError: for an inconsistent config (see :func:`validate_config` and
      :func:`config_checks.check_settings`) or an empty split (:func:`config_checks.check_splits`).
    errors.WorkdirLockedError: another run holds the workdir.
    errors.NonFiniteError: a loss, gradient norm or parameter became NaN or inf.
    errors.CheckpointError: a save failed, no checkpoint is intact, or ``best/`` holds
      another run's checkpoint.
    errors.ConfigMismatchError: the checkpoint resumed was computed with other settings:
      ``model.*``, or without ``allow_resume_changes`` any field outside
      :data:`run_record.RESUME_ALLOWED_FIELDS`, the task data's vocabulary size, class count
      or contents, or the device or host count (:func:`run_record.check_resume`).
    NotADirectoryError: ``workdir`` is a file (:func:`make_workdir`).
    preemption.PreemptedError: SIGTERM or SIGINT came after the data were loaded
      (:class:`preemption.PreemptionGuard`): in the loop (every host stops at the same step)
      that step was finished, logged and saved; while building, restoring or precompiling,
      nothing had been trained since the checkpoint. The lock is released; no test, no
      ``results.json``. A signal while the data load raises ``KeyboardInterrupt`` (SIGINT)
      or ends the process (SIGTERM), as Python's defaults do; the lock is released on
      SIGINT and replaced as stale after SIGTERM.
    errors.WriteError: ``metrics.jsonl``, the TensorBoard file, ``results.json`` or
      ``transfer.json`` could not be written (named; a failed checkpoint save is a
      ``CheckpointError``).
  """
  if precompile_workers < 0:
    raise ValueError(f"--precompile_workers={precompile_workers} must be >= 0 (0: off)")
  wall_start = time.time()
  validate_config(config, jax.device_count(), jax.process_count())
  check_async_supported(config.get("async_checkpoints", False), jax.process_count())
  config_checks.check_settings(config)
  make_workdir(workdir)
  lock = run_guard.acquire_lock(workdir) if jax.process_index() == 0 else None
  logger = profiler = None
  guard = preemption.PreemptionGuard()   # SIGTERM/SIGINT: save (if trained) and stop
  try:   # from here on every exit releases the lock (the `finally` below)
    data = data or tasks.load_task(config)
    distributed.check_hosts_agree(config, data)  # every host: process 0's config and data
    config_checks.check_splits(data, config)
    if jax.process_index() == 0:   # loaders that truncate while loading report there
      for name in ("train", "val", "test"):
        report_split_truncation(name, getattr(data, name), int(config.model.max_length))
    # A signal from here on (building, restoring, compiling, training) stops the run at the
    # next point where it can stop cleanly, saving what it trained.
    guard.install()
    model = build_model(config, data)

    init_rng, dropout_root = jax.random.split(jax.random.PRNGKey(int(config.seed)))
    state = create_train_state(config, model, init_rng)
    ckpts = checkpoint_manager(os.path.join(workdir, "checkpoints"), config.max_to_keep,
                               async_save=config.get("async_checkpoints", False))
    best_ckpts = checkpoint_manager(os.path.join(workdir, "best"), None,  # see prune_best
                                    async_save=config.get("async_checkpoints", False))
    distributed.check_same_checkpoints(ckpts.all_steps(), str(ckpts.directory))
    meta = {"best_val_accuracy": -1.0, "best_step": -1, "train_seconds": 0.0}
    start_step = 0
    config_path = os.path.join(workdir, "config.json")
    previous_config = read_config_json(config_path)   # before this start overwrites it
    record = run_record.run_record(config, vocab_size=data.vocab_size,
                                  num_classes=data.num_classes, num_devices=jax.device_count(),
                                  num_hosts=jax.process_count(),
                                  data_sha256=distributed.data_fingerprint(data))
    changes = []   # this start's changes from the checkpoint's settings (config history)

    def resume_check(where: str, saved_meta: dict, model_diff: list[str]) -> None:
      saved = saved_meta.get(run_record.RECORD_KEY)
      if saved is None:   # saved before run records existed
        errors.warn(f"{where} predates run records: only its model config"
                    f"{' and ' + config_path if previous_config else ''} can be compared "
                    "with this config; the device count and the data cannot")
        saved = {"config": previous_config} if previous_config else None
      changes[:] = run_record.check_resume(where, saved, record, model_diff=model_diff,
                                          allow_changes=allow_resume_changes)

    if ckpts.all_steps():
      state, meta, start_step = restore_checkpoint(
          ckpts, state, model_config=config.model,
          quarantine_dir=os.path.join(workdir, "damaged"), resume_check=resume_check)
      print(f"Resumed from {workdir}/checkpoints at step {start_step}", file=sys.stderr)
      if changes:
        print(f"Settings changed since the checkpoint (recorded in {config_path}): "
              + "; ".join(run_record.describe_change(c) for c in changes), file=sys.stderr)
    else:
      state = apply_init_from(config, state, workdir)
    legacy = start_step > 0 and "run_id" not in meta  # saved before run ids existed
    meta.update(run_id=run_guard.lineage_id(workdir, meta.get("run_id")),
                model_config=model_config_dict(config.model), **{run_record.RECORD_KEY: record})
    meta = reconcile_best(best_ckpts, meta, start_step, legacy)
    last_good = step_dir(ckpts, start_step) if start_step else "none (nothing saved yet)"
    accum = config.grad_accum_steps
    results_path = os.path.join(workdir, "results.json")
    history = (previous_config or {}).get(run_record.CONFIG_HISTORY_KEY, [])
    config_tree = config_with_history(config, history, changes, start_step)
    new_forced = (any(not c["allowed"] for c in changes)   # not yet in config.json's history
                  and len(config_tree.get(run_record.CONFIG_HISTORY_KEY, [])) > len(history))
    if start_step >= config.num_train_steps and not new_forced:
      finished = _finished_results(workdir, config)   # a rerun of a finished run
      if finished is not None:
        print(f"{workdir} finished training at step {start_step} and {results_path} is its "
              "result: nothing to do, nothing rewritten", file=sys.stderr)
        return finished
    software = run_record.software(jax.devices()[0].device_kind, jax.device_count(),
                                   jax.process_count())
    forced = run_record.forced_changes(config_tree.get(run_record.CONFIG_HISTORY_KEY))
    if jax.process_index() == 0:
      atomic_io.write_json_atomic(config_path,
                                  {**config_tree, run_record.SOFTWARE_KEY: software})
    # The test records an earlier start wrote at or before this start's step (a run killed
    # while testing, a finished run resumed with forced changes): reused, never written twice.
    earlier = _earlier_records(os.path.join(workdir, "metrics.jsonl"), start_step)
    if guard.requested_locally():   # a signal while building or restoring: nothing to save
      raise preemption.PreemptedError(start_step, guard.cause)
    logger = MetricLogger(workdir, resume_step=start_step, enabled=jax.process_index() == 0,
                          config=config, run_id=meta["run_id"])
    if (jax.process_index() == 0 and start_step < config.num_train_steps
        and os.path.exists(results_path)):   # it would no longer describe the workdir
      try:
        os.remove(results_path)
      except OSError as e:
        raise errors.WriteError(
            f"could not remove {results_path}, the results of an earlier run that this one "
            f"trains past (from step {start_step}): {e.strerror or e}. Delete it, then rerun "
            "the same command.") from e
      print(f"removed {results_path} of an earlier run; it is written again when this run "
            "ends", file=sys.stderr)
    logger.write(start_step,
                 {"params": sum(x.size for x in jax.tree_util.tree_leaves(state.params))}, "info")
    logger.write_parameter_overview(state.params)   # stderr and parameter_overview.txt
    profiler = profiling.StepProfiler(
        os.path.join(workdir, "profile"),
        profiling.check_profile_steps(profile_steps, config.num_train_steps), start_step,
        enabled=jax.process_index() == 0)

    parallel = make_parallel(config.get("parallelism", "pmap"))
    p_train, p_eval = parallel.steps(state.apply_fn)
    state_repl = parallel.put_state(state)
    schedule = make_schedule(config)
    train_programs, eval_fn, precompiled = {}, p_eval, {}   # {batch_shape_key: program}
    if precompile_workers:
      try:
        train_steps, eval_fn, precompiled = precompile.precompile_steps(
            p_train, p_eval, state_repl, data, config, start_step * accum, precompile_workers,
            parallel, should_stop=guard.requested_locally)
      except precompile.Stopped:   # nothing trained since the checkpoint: nothing to save
        logger.close()
        raise preemption.PreemptedError(start_step, guard.cause) from None
      logger.write(start_step, precompiled, "info")
      print(f"precompiled {precompiled['precompiled_train_shapes']} train and "
            f"{precompiled['precompiled_eval_shapes']} eval step shapes in "
            f"{precompiled['precompile_seconds']:.1f} s ({precompile_workers} threads)",
            file=sys.stderr)
      train_programs = train_steps.compiled
    batches = train_batches(data.train, config, start_step * accum)
    in_flight = InFlightLimit()   # the host runs at most a few micro-steps ahead
    window = dict.fromkeys((*steps.METRICS, "count"), 0.0)
    window_sums, window_steps = [], 0
    unchecked = []        # (step, metrics) of the micro-steps since the last finiteness check
    window_start, window_excluded = time.time(), 0.0
    # Each new batch shape (a length bucket) compiles its own step inside p_train's call; that
    # call's time is logged as compile_seconds, and steps/s is also given without it.
    seen_shapes = set(train_programs)   # precompiled shapes count as seen
    window_compile_s, window_new_shapes, compile_s_this_run, loop_shapes = 0.0, 0, 0.0, 0
    # The majority rate of the examples the last validation read: saved with each checkpoint,
    # so a start that trains no step reports the same figure as the start that validated.
    val_majority = meta.get("val_majority_rate")
    train_seconds = float(meta["train_seconds"])
    bar = progress.bar(total=config.num_train_steps, initial=start_step, desc="train",
                       disable=jax.process_index() != 0, dynamic_ncols=True, mininterval=1.0)
    budget_s = 60.0 * float(config.get("max_train_minutes", 0) or 0)
    last_step = config.num_train_steps
    preempted = False
    for step in range(start_step + 1, config.num_train_steps + 1):
      profiler.step_started(step)   # --profile_steps: the trace starts before step A
      for a in range(accum):
        batch = parallel.put_batch(next(batches))
        rng = jax.random.fold_in(dropout_root, (step - 1) * accum + a)
        shapes = batch_shape_key(batch)
        step_fn = train_programs.get(shapes, p_train)
        if shapes in seen_shapes:
          state_repl, sums = step_fn(state_repl, batch, rng)
        else:   # drain the queue first, so the call's time is the compile's alone
          jax.block_until_ready(state_repl)
          call_start = time.time()
          state_repl, sums = step_fn(state_repl, batch, rng)
          seen_shapes.add(shapes)
          window_compile_s += time.time() - call_start
          window_new_shapes += 1
          loop_shapes += 1
        window_sums.append(sums)
        unchecked.append((step, sums))
        in_flight.add(sums)
      window_steps += 1
      bar.update(1)
      profiler.step_finished(step, state_repl)   # after step B: wait for it, stop the trace
      out_of_time = bool(budget_s) and distributed.agree_on_flag(
          time.time() - wall_start > budget_s)
      final = step == config.num_train_steps or out_of_time
      preempted = guard.should_stop(step)   # every host at the same step
      stop = final or preempted   # log and save; only `final` validates (as a straight run)

      if stop or not (step % config.log_every and step % config.eval_frequency
                      and step % config.checkpoint_every):
        check_finite(unchecked, state_repl, last_good, parallel)  # before anything is logged or saved
        unchecked = []
      if step % config.log_every == 0 or stop:
        for sums in parallel.host(window_sums):
          for k in window:
            window[k] += float(sums[k])
        elapsed = max(time.time() - window_start - window_excluded, 1e-9)
        train_seconds += elapsed
        means = steps.metric_means(window)
        logger.write(step, {**{k: means[k] for k in steps.METRICS},
                            "learning_rate": float(schedule(step - 1)),
                            "steps_per_sec": window_steps / elapsed,
                            "steps_per_sec_excluding_compile":
                                window_steps / max(elapsed - window_compile_s, 1e-9),
                            "compile_seconds": window_compile_s,
                            "new_shapes": window_new_shapes}, "train")
        bar.set_postfix(loss=f"{means['loss']:.3f}", acc=f"{means['accuracy']:.3f}")
        window = dict.fromkeys(window, 0.0)
        window_sums, window_steps = [], 0
        window_start, window_excluded = time.time(), 0.0
        compile_s_this_run += window_compile_s
        window_compile_s, window_new_shapes = 0.0, 0

      pause_start = time.time()
      if step % config.eval_frequency == 0 or final:
        val = evaluate(eval_fn, state_repl.params, data.val, config,
                       config.get("num_eval_steps", -1), parallel)
        logger.write(step, val, "val")
        if not math.isfinite(val["loss"]):
          raise errors.NonFiniteError(
              f"step {step}: the validation loss is {val['loss']}; the run stopped without "
              f"saving this state. The last good checkpoint is {last_good}.")
        val_majority = meta["val_majority_rate"] = val["majority_rate"]
        bar.write(f"step {step}: val accuracy {val['accuracy']:.4f} loss {val['loss']:.4f}")
        if val["accuracy"] > meta["best_val_accuracy"]:
          meta.update(best_val_accuracy=val["accuracy"], best_step=step)
          save_checkpoint(best_ckpts, step, parallel.host(state_repl), meta)

      if step % config.checkpoint_every == 0 or stop:
        meta["train_seconds"] = train_seconds
        save_checkpoint(ckpts, step, parallel.host(state_repl), meta)
        last_good = step_dir(ckpts, step)
        prune_best(best_ckpts, meta["best_step"])
      if step_hook is not None:
        finish_saves(ckpts, best_ckpts)   # a hook sees the step's checkpoints on disk
        step_hook(step)
      window_excluded += time.time() - pause_start
      if preempted:
        last_step = step
        break
      if out_of_time:
        last_step = step
        bar.write(f"max_train_minutes={config.max_train_minutes} reached after step {step}; "
                  "rerun with the same workdir to continue")
        break
    guard.restore()   # from here on, a signal ends the process: the last step is saved
    bar.close()
    finish_saves(ckpts, best_ckpts)   # the newest step is on disk, or CheckpointError
    if guard.requested_locally() and not preempted:   # it came after the last step's check
      preempted = True
    if preempted:   # no test: the scheduler's grace period is short
      bar.write(f"{guard.cause}: saved step {last_step} to {last_good}")
      logger.close()
      raise preemption.PreemptedError(last_step, guard.cause)

    # Two protocols: the final parameters (LRA's --test_only) and the best-validation
    # checkpoint (SimpleTRON's); the two coincide when the last validation was the best. A test
    # an earlier start recorded is reused, not repeated (:func:`_test_metrics`).
    test_limit = config.get("num_test_steps", -1)
    final_test = _test_metrics(
        earlier, logger, last_step, "test_final",
        lambda: evaluate(eval_fn, state_repl.params, data.test, config, test_limit, parallel))
    best_step = meta["best_step"]

    def best_test():
      best_state, _, _ = restore_checkpoint(best_ckpts, state, step=best_step,
                                            model_config=config.model)
      return evaluate(eval_fn, parallel.put_state(best_state.params), data.test, config,
                      test_limit, parallel)

    test = _test_metrics(earlier, logger, best_step, "test",
                         (lambda: final_test) if best_step == last_step else best_test)
    if val_majority is None:   # a checkpoint from before val_majority_rate was saved in it
      val_majority = _last_val_majority(earlier, last_step, data.val)
    complete = last_step >= config.num_train_steps
    results = {
        "task": config.task, "attention": config.model.attention,
        "test_accuracy": test["accuracy"], "test_loss": test["loss"],
        "test_accuracy_best_val": test["accuracy"], "test_loss_best_val": test["loss"],
        "test_accuracy_final": final_test["accuracy"], "test_loss_final": final_test["loss"],
        "final_step": last_step,
        "test_majority_rate": test["majority_rate"],
        "val_majority_rate": val_majority,
        "best_step": best_step, "best_val_accuracy": meta["best_val_accuracy"],
        "num_train_steps": config.num_train_steps, "last_step": last_step,
        "complete": complete, "stopped_by": None if complete else "max_train_minutes",
        "config_fingerprint": run_record.config_fingerprint(config),
        run_record.FORCED_KEY: forced,
        "steps_per_sec": last_step / max(train_seconds, 1e-9),
        "train_seconds": train_seconds,
        "train_compile_seconds_this_run": compile_s_this_run,
        "train_shapes_compiled_in_loop": loop_shapes,
        **precompiled,
        "wall_seconds_this_run": time.time() - wall_start,
        "num_devices": jax.device_count(), "data_source": data.source,
        **software,
    }
    if jax.process_index() == 0:
      atomic_io.write_json_atomic(results_path, results)   # never a half-written file
    logger.close()
    return results
  finally:   # also on errors and preemption: no handler, open file or lock is left behind
    guard.restore()
    if profiler is not None:
      profiler.close()   # a trace that an error or a preemption left running
    try:
      if logger is not None:
        logger.close()   # a no-op after a success; after an error, its own would hide the first
    except errors.WriteError:
      pass
    run_guard.release_lock(lock)


def evaluate_checkpoint(workdir: str, split: str = "test", which: str = "best",
                        step: int | None = None,
                        config: ml_collections.ConfigDict | None = None,
                        precompile_workers: int = 0) -> dict[str, Any]:
  """Restores a checkpoint of ``workdir`` and evaluates it on ``split``.

  Args:
    workdir: a train.py run directory.
    split: ``"train"``, ``"val"`` or ``"test"``.
    which: ``"best"`` (the best-validation checkpoint) or ``"latest"``.
    step: restore this optimizer step from ``workdir/checkpoints`` instead.
    config: overrides the run's saved config.
    precompile_workers: if > 0, the eval step of every batch shape the split meets is
      compiled first, in this many threads side by side (:mod:`simpletron_jax.precompile`).

  Returns:
    ``{"accuracy", "loss", "count", "step", "split", "checkpoint"}``.

  Raises:
    FileNotFoundError: when the workdir (which is never created), its checkpoint folder,
      the checkpoint or its config is missing.
    ValueError: for an unknown split or ``which``, or ``precompile_workers < 0``.
    errors.ConfigMismatchError: ``config`` is of another task than the run's ``config.json``
      (named before the model configs are compared), or its model config differs from the
      checkpoint's.
  """
  if split not in ("train", "val", "test") or which not in ("best", "latest"):
    raise ValueError(f"split={split!r} / which={which!r} not understood")
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f"--workdir {workdir!r} is not a folder: pass the workdir of a "
                            "train.py run")
  if config is not None:
    saved = read_config_json(os.path.join(workdir, "config.json")) or {}
    if saved.get("task") not in (None, config.task):
      raise errors.ConfigMismatchError(
          f"--config is a config of task {config.task!r}, but {workdir} trained task "
          f"{saved['task']!r} ({os.path.join(workdir, 'config.json')}): pass a "
          f"configs/{saved['task']}/... config, or leave --config out to use the run's own")
  config = config or load_run_config(workdir)
  sub = "best" if which == "best" and step is None else "checkpoints"
  if not os.path.isdir(os.path.join(workdir, sub)):
    raise FileNotFoundError(f"{os.path.join(workdir, sub)} not found: the run saved no "
                            f"{'best-validation ' if sub == 'best' else ''}checkpoint yet")
  data = tasks.load_task(config)
  report_split_truncation(split, getattr(data, split), int(config.model.max_length))
  model = build_model(config, data)
  state = create_train_state(config, model, jax.random.PRNGKey(0))
  manager = checkpoint_manager(os.path.join(workdir, sub), config.max_to_keep)
  state, _, restored_step = restore_checkpoint(manager, state, step, model_config=config.model)
  if precompile_workers < 0:
    raise ValueError(f"--precompile_workers={precompile_workers} must be >= 0 (0: off)")
  parallel = make_parallel(config.get("parallelism", "pmap"))
  _, p_eval = parallel.steps(state.apply_fn)
  limit = config.get("num_test_steps", -1) if split == "test" else config.get("num_eval_steps", -1)
  params_repl = parallel.put_state(state.params)
  if precompile_workers:
    start = time.time()
    p_eval = precompile.precompile_eval_step(p_eval, params_repl,
                                             [(getattr(data, split), limit)], config,
                                             precompile_workers, parallel)
    print(f"precompiled {len(p_eval.compiled)} eval step shapes in "
          f"{time.time() - start:.1f} s ({precompile_workers} threads)", file=sys.stderr)
  metrics = evaluate(p_eval, params_repl, getattr(data, split), config, limit, parallel)
  return {**metrics, "step": restored_step, "split": split,
          "checkpoint": os.path.join(workdir, sub)}
