"""A run's final tests and ``results.json``, and :func:`evaluate_checkpoint` (eval.py).

The final parameters are tested as LRA's ``--test_only`` (``listops/train.py``; Tay et al.,
2020), the best-validation checkpoint as SimpleTRON's protocol.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Callable, Mapping

import jax
import ml_collections

from simpletron_jax.train import checkpoints, evaluation, loop, precompile, saved_runs
from simpletron_jax.run import metric_logging, run_record
from simpletron_jax.data.batches import BatchConfig
from simpletron_jax.data.common import report_split_truncation
from simpletron_jax.train.run_config import RunConfig
from simpletron_jax.train.steps import JitParallel, PmapParallel, make_parallel


def recorded_test(earlier: dict, logger: metric_logging.MetricLogger, step: int, split: str,
                  compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
  """The ``split`` (``test`` or ``test_final``) metrics of ``step``: the record an earlier
  start wrote, or ``compute()`` written as a new record. On several hosts ``compute`` always
  runs (a collective every host joins); only an unrecorded result is written."""
  recorded = earlier.get((step, split))
  if recorded is not None and jax.process_count() == 1:
    return {k: v for k, v in recorded.items() if k not in ("step", "split", "time")}
  metrics = compute()
  if recorded is None:
    logger.write(step, metrics, split)
  return metrics


def last_val_majority(earlier: dict, step: int, val: Any) -> float:
  """The majority-class rate of the last validation recorded at or before ``step``, else of
  the whole validation split."""
  recorded = [r for (s, split), r in sorted(earlier.items()) if split == "val" and s <= step]
  if recorded and recorded[-1].get("majority_rate") is not None:
    return float(recorded[-1]["majority_rate"])
  return val.majority_rate()


def evaluator(eval_fn: Callable, examples: Any, batch_config: BatchConfig,
              limit: int, parallel: PmapParallel | JitParallel) -> Callable[[Any], dict]:
  """``params_repl -> metrics`` of ``examples`` (a split), at most ``limit`` batches (-1: all),
  by :func:`evaluation.evaluate`."""
  return lambda params_repl: evaluation.evaluate(eval_fn, params_repl, examples, batch_config,
                                                 limit, parallel)


def final_and_best_tests(start: Any, earlier: dict,
                         logger: metric_logging.MetricLogger, evaluate_test: Callable,
                         params_repl: Any, parallel: PmapParallel | JitParallel, last_step: int
                         ) -> tuple[dict[str, Any], dict[str, Any]]:
  """``(final, best)``: the test metrics of the parameters after ``last_step`` and of the
  best-validation checkpoint; a test an earlier start recorded is reused (:func:`recorded_test`).

  Args:
    start: the run's ``trainer._Start`` (``run_state``, ``ckpts``, ``state``).
    evaluate_test: ``evaluate_test(params_repl) -> metrics`` of the test split.

  Raises:
    errors.CheckpointError: the best checkpoint cannot be restored intact.
  """
  final_test = recorded_test(earlier, logger, last_step, "test_final",
                             lambda: evaluate_test(params_repl))
  best_step = start.run_state.best_step

  def best_test():
    best_state, _, _ = checkpoints.restore_checkpoint(start.ckpts, start.state,
                                                      step=best_step,
                                                      model_config=start.run_state.model_config)
    return evaluate_test(parallel.put_state(best_state.params))

  test = recorded_test(earlier, logger, best_step, "test",
                       (lambda: final_test) if best_step == last_step else best_test)
  return final_test, test


@dataclasses.dataclass(frozen=True)
class Results:
  """The contents of ``results.json`` (docs/runs.md); :meth:`to_json` gives the file's object.

  Attributes:
    task, attention: the run's ``config.task`` and ``model.attention``.
    test_accuracy_best_val, test_loss_best_val: the test of the best-validation checkpoint
      (SimpleTRON's protocol).
    test_accuracy_final, test_loss_final: the test of the parameters after ``final_step``
      (LRA's).
    final_step: the last optimizer step trained.
    test_majority_rate, val_majority_rate: the majority-class rates of the splits.
    best_step, best_val_accuracy: the best validation and its step.
    num_train_steps: the steps the config trains.
    complete: ``final_step`` reached ``num_train_steps``; stopped_by: else what stopped it
      (``max_train_minutes``).
    config_fingerprint: :func:`run_record.config_fingerprint` of the config.
    forced_resume_changes: the starts that ``--allow_resume_changes`` let change what is
      computed (:data:`run_record.FORCED_KEY`).
    steps_per_sec, train_seconds: the training throughput and time over every start.
    train_compile_seconds_this_run, train_shapes_compiled_in_loop: this start's train calls
      that compiled a batch shape.
    precompiled: ``precompile_seconds`` and the shape counts of ``--precompile_workers``
      (empty without), written as keys of their own.
    wall_seconds_this_run: this start's wall-clock seconds.
    num_devices: devices of the run; data_source: where the data came from.
    software: :func:`simpletron_jax.run.software_record.software`, written as keys of their
      own.
  """

  task: str
  attention: str
  test_accuracy_best_val: float
  test_loss_best_val: float
  test_accuracy_final: float
  test_loss_final: float
  final_step: int
  test_majority_rate: float
  val_majority_rate: float
  best_step: int
  best_val_accuracy: float
  num_train_steps: int
  complete: bool
  stopped_by: str | None
  config_fingerprint: str
  forced_resume_changes: list
  steps_per_sec: float
  train_seconds: float
  train_compile_seconds_this_run: float
  train_shapes_compiled_in_loop: int
  precompiled: Mapping[str, Any]
  wall_seconds_this_run: float
  num_devices: int
  data_source: str
  software: Mapping[str, Any]

  def to_json(self) -> dict[str, Any]:
    """The file's object: the fields in order, ``precompiled`` and ``software`` spread."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      out.update(value if field.name in ("precompiled", "software") else {field.name: value})
    return out


@dataclasses.dataclass(frozen=True)
class Tests:
  """A run's tests: ``final`` and ``best`` (:func:`final_and_best_tests`' metrics dicts),
  the validation split's majority-class rate and the last optimizer step trained."""
  final: Mapping[str, Any]
  best: Mapping[str, Any]
  val_majority_rate: float
  last_step: int


@dataclasses.dataclass(frozen=True)
class RunFacts:
  """What ``results.json`` records beside the numbers: the config's
  :func:`run_record.config_fingerprint`, the data source, the software, this start's
  ``--precompile_workers`` figures and its wall-clock start (``time.time()``, seconds)."""
  config_fingerprint: str
  data_source: str
  software: Mapping[str, Any]
  precompiled: Mapping[str, Any]
  wall_start: float


def run_results(run: RunConfig, start: Any, tests: Tests, window: loop.TrainWindow,
                facts: RunFacts) -> Results:
  """The run's :class:`Results`; ``start`` is the run's ``trainer._Start`` (the best
  validation, ``config.json``'s history)."""
  last_step = tests.last_step
  complete = last_step >= run.train.num_train_steps
  return Results(
      task=run.task, attention=run.model.attention,
      test_accuracy_best_val=tests.best["accuracy"], test_loss_best_val=tests.best["loss"],
      test_accuracy_final=tests.final["accuracy"], test_loss_final=tests.final["loss"],
      final_step=last_step, test_majority_rate=tests.best["majority_rate"],
      val_majority_rate=tests.val_majority_rate, best_step=start.run_state.best_step,
      best_val_accuracy=start.run_state.best_val_accuracy,
      num_train_steps=run.train.num_train_steps, complete=complete,
      stopped_by=None if complete else "max_train_minutes",
      config_fingerprint=facts.config_fingerprint,
      forced_resume_changes=run_record.forced_changes(
          start.config_tree.get(run_record.CONFIG_HISTORY_KEY)),
      steps_per_sec=last_step / max(window.train_seconds, 1e-9),
      train_seconds=window.train_seconds,
      train_compile_seconds_this_run=window.compile_seconds_this_run,
      train_shapes_compiled_in_loop=window.shapes_compiled, precompiled=facts.precompiled,
      wall_seconds_this_run=time.time() - facts.wall_start, num_devices=jax.device_count(),
      data_source=facts.data_source, software=facts.software)


def evaluate_checkpoint(workdir: str, split: str = "test", which: str = "best",
                        step: int | None = None,
                        config: ml_collections.ConfigDict | None = None,
                        precompile_workers: int = 0) -> dict[str, Any]:
  """Restores a checkpoint of ``workdir`` (:func:`saved_runs.load_run`) and evaluates it on
  ``split``.

  Args:
    split: ``"train"``, ``"val"`` or ``"test"``.
    workdir, which, step, config: see :func:`saved_runs.load_run`.
    precompile_workers: threads that compile the split's eval step shapes first; 0: none.

  Returns:
    ``{"accuracy", "loss", "count", "step", "split", "checkpoint"}``.

  Raises:
    ValueError: an unknown split or ``which``, or ``precompile_workers < 0``.
    FileNotFoundError, errors.ConfigMismatchError, errors.CheckpointError: see
      :func:`saved_runs.load_run`, :meth:`SavedRun.restore`.
  """
  if split not in ("train", "val", "test"):
    raise ValueError(f"split={split!r} not understood: 'train', 'val' or 'test'")
  if precompile_workers < 0:
    raise ValueError(f"--precompile_workers={precompile_workers} must be >= 0 (0: off)")
  saved = saved_runs.load_run(workdir, which, step, config)
  _, run, data, state = saved.restore()
  report_split_truncation(split, getattr(data, split), run.model.max_length)
  parallel = make_parallel(run.train.parallelism)
  _, p_eval = parallel.steps(state.apply_fn)
  limit = run.eval.num_test_steps if split == "test" else run.eval.num_eval_steps
  params_repl = parallel.put_state(state.params)
  if precompile_workers:
    start = time.time()
    p_eval = precompile.precompile_eval_step(p_eval, params_repl,
                                             [(getattr(data, split), limit)], run.batches,
                                             precompile_workers, parallel)
    print(f"precompiled {len(p_eval.compiled)} eval step shapes in "
          f"{time.time() - start:.1f} s ({precompile_workers} threads)", file=sys.stderr)
  metrics = evaluation.evaluate(p_eval, params_repl, getattr(data, split), run.batches, limit,
                                parallel)
  return {**metrics, "step": saved.step, "split": split,
          "checkpoint": saved.folder.checkpoints_dir}
