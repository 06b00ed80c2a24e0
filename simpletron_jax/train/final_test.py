"""A run's final tests and ``results.json``, and :func:`evaluate_checkpoint` (eval.py).

The final parameters are tested as LRA's ``--test_only`` (``listops/train.py``; Tay et al.,
2020), the best-validation checkpoint as SimpleTRON's protocol.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable

import jax
import ml_collections

from simpletron_jax.data import tasks
from simpletron_jax.runtime import distributed, errors
from simpletron_jax.train import checkpoints, evaluation, loop, precompile, train_state
from simpletron_jax.run import metric_logging, run_record
from simpletron_jax.data.common import report_split_truncation
from simpletron_jax.train.run_config import RunConfig
from simpletron_jax.train.steps import JitParallel, PmapParallel, make_parallel


def earlier_records(path: str, start_step: int) -> dict[tuple[int, str], dict[str, Any]]:
  """``{(step, split): record}`` of ``metrics.jsonl``'s ``val``, ``test`` and ``test_final``
  records at or before ``start_step`` (the last of each); empty for a fresh start.

  Raises:
    ValueError: ``path:line:`` for a damaged line (:func:`metric_logging.read_records`).
  """
  if start_step <= 0 or not os.path.exists(path):
    return {}
  return {(r["step"], r["split"]): r for r in metric_logging.read_records(path)
          if r["step"] <= start_step and r.get("split") in ("val", "test", "test_final")}


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


def finished_results(workdir: str, config: ml_collections.ConfigDict,
                      start_step: int) -> dict[str, Any] | None:
  """``workdir/results.json`` when it is the finished result of ``config``
  (:func:`run_record.workdir_results_problem`), else None; process 0 decides for every host.

  Raises:
    OSError, ValueError: another host cannot read the file process 0 found.
  """
  problem = (run_record.workdir_results_problem(workdir, config, count_forced=True)
             if jax.process_index() == 0 else None)
  if not distributed.agree_on_flag(problem is None):
    return None
  results_path = os.path.join(workdir, "results.json")
  with open(results_path, encoding="utf-8") as f:
    results = json.load(f)
  print(f"{workdir} finished training at step {start_step} and {results_path} is its "
        "result: nothing to do, nothing rewritten", file=sys.stderr)
  return results


def evaluator(eval_fn: Callable, examples: Any, config: ml_collections.ConfigDict,
               limit: int, parallel: PmapParallel | JitParallel) -> Callable[[Any], dict]:
  """``params_repl -> metrics`` of ``examples`` (a split), at most ``limit`` batches (-1: all),
  by :func:`evaluation.evaluate`."""
  return lambda params_repl: evaluation.evaluate(eval_fn, params_repl, examples, config, limit,
                                                 parallel)


def final_and_best_tests(start: Any, earlier: dict,
                         logger: metric_logging.MetricLogger, evaluate_test: Callable,
                         params_repl: Any, parallel: PmapParallel | JitParallel, last_step: int
                         ) -> tuple[dict[str, Any], dict[str, Any]]:
  """``(final, best)``: the test metrics of the parameters after ``last_step`` and of the
  best-validation checkpoint; a test an earlier start recorded is reused (:func:`recorded_test`).

  Args:
    start: the run's ``trainer._Start`` (``meta``, ``ckpts``, ``state``).
    evaluate_test: ``evaluate_test(params_repl) -> metrics`` of the test split.

  Raises:
    errors.CheckpointError: the best checkpoint cannot be restored intact.
  """
  final_test = recorded_test(earlier, logger, last_step, "test_final",
                             lambda: evaluate_test(params_repl))
  best_step = start.meta["best_step"]

  def best_test():
    best_state, _, _ = checkpoints.restore_checkpoint(start.ckpts, start.state,
                                                      step=best_step,
                                                      model_config=start.meta["model_config"])
    return evaluate_test(parallel.put_state(best_state.params))

  test = recorded_test(earlier, logger, best_step, "test",
                       (lambda: final_test) if best_step == last_step else best_test)
  return final_test, test


def run_results(run: RunConfig, fingerprint: str, data: tasks.TaskData, start: Any,
                tests: tuple[dict[str, Any], dict[str, Any]], val_majority: float,
                last_step: int, window: loop.TrainWindow, precompiled: dict[str, Any],
                wall_start: float, software: dict[str, Any]) -> dict[str, Any]:
  """The contents of ``results.json`` (docs/runs.md); ``tests`` is
  :func:`final_and_best_tests`' ``(final, best)``."""
  final_test, test = tests
  complete = last_step >= run.train.num_train_steps
  return {
      "task": run.task, "attention": run.model.attention,
      "test_accuracy": test["accuracy"], "test_loss": test["loss"],
      "test_accuracy_best_val": test["accuracy"], "test_loss_best_val": test["loss"],
      "test_accuracy_final": final_test["accuracy"], "test_loss_final": final_test["loss"],
      "final_step": last_step,
      "test_majority_rate": test["majority_rate"],
      "val_majority_rate": val_majority,
      "best_step": start.meta["best_step"], "best_val_accuracy": start.meta["best_val_accuracy"],
      "num_train_steps": run.train.num_train_steps, "last_step": last_step,
      "complete": complete, "stopped_by": None if complete else "max_train_minutes",
      "config_fingerprint": fingerprint,
      run_record.FORCED_KEY: run_record.forced_changes(
          start.config_tree.get(run_record.CONFIG_HISTORY_KEY)),
      "steps_per_sec": last_step / max(window.train_seconds, 1e-9),
      "train_seconds": window.train_seconds,
      "train_compile_seconds_this_run": window.compile_seconds_this_run,
      "train_shapes_compiled_in_loop": window.shapes_compiled,
      **precompiled,
      "wall_seconds_this_run": time.time() - wall_start,
      "num_devices": jax.device_count(), "data_source": data.source,
      **software,
  }


def restore_run(workdir: str, which: str = "best", step: int | None = None,
                config: ml_collections.ConfigDict | None = None
                ) -> tuple[ml_collections.ConfigDict, RunConfig, tasks.TaskData, Any, int, str]:
  """A ``train.py`` run's config, task data and checkpoint, restored and verified.

  Args:
    workdir: the run's folder.
    which: ``"best"`` (the best-validation checkpoint) or ``"latest"``.
    step: restore this optimizer step instead.
    config: overrides the run's saved config (``config.json``).

  Returns:
    ``(config, run, data, state, step, folder)``: the ConfigDict and its :class:`RunConfig`,
    the task data, the train state restored at ``step`` from ``folder``
    (``workdir/checkpoints``).

  Raises:
    FileNotFoundError: the workdir, its checkpoints or its config is missing.
    ValueError: an unknown ``which``, or a config field that fails its check.
    errors.ConfigMismatchError: ``config`` is of another task or model than the run's.
    errors.CheckpointError: the checkpoint is damaged.
  """
  if which not in ("best", "latest"):
    raise ValueError(f"which={which!r} not understood: 'best' or 'latest'")
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f"--workdir {workdir!r} is not a folder: pass the workdir of a "
                            "train.py run")
  if config is not None:
    saved = run_record.read_config_json(os.path.join(workdir, "config.json")) or {}
    if saved.get("task") not in (None, config.task):
      raise errors.ConfigMismatchError(
          f"--config is a config of task {config.task!r}, but {workdir} trained task "
          f"{saved['task']!r} ({os.path.join(workdir, 'config.json')}): pass a "
          f"configs/{saved['task']}/... config, or leave --config out to use the run's own")
  config = config or run_record.load_run_config(workdir)
  run = RunConfig.from_config_dict(config)
  folder = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(folder):
    raise FileNotFoundError(f"{folder} not found: the run saved no checkpoint yet")
  manager = checkpoints.checkpoint_manager(folder, None)
  if step is None:
    step = checkpoints.pick_step(manager, which, f"--workdir {workdir}")
  data = tasks.load_task(config)
  model = train_state.build_model(config, data)
  state = train_state.create_train_state(run.train, model, jax.random.PRNGKey(0),
                                         run.model.max_length)
  state, _, step = checkpoints.restore_checkpoint(manager, state, step, model_config=config.model)
  return config, run, data, state, step, folder


def evaluate_checkpoint(workdir: str, split: str = "test", which: str = "best",
                        step: int | None = None,
                        config: ml_collections.ConfigDict | None = None,
                        precompile_workers: int = 0) -> dict[str, Any]:
  """Restores a checkpoint of ``workdir`` (:func:`restore_run`) and evaluates it on ``split``.

  Args:
    split: ``"train"``, ``"val"`` or ``"test"``.
    workdir, which, step, config: see :func:`restore_run`.
    precompile_workers: threads that compile the split's eval step shapes first; 0: none.

  Returns:
    ``{"accuracy", "loss", "count", "step", "split", "checkpoint"}``.

  Raises:
    ValueError: an unknown split or ``which``, or ``precompile_workers < 0``.
    FileNotFoundError, errors.ConfigMismatchError, errors.CheckpointError: see
      :func:`restore_run`.
  """
  if split not in ("train", "val", "test"):
    raise ValueError(f"split={split!r} not understood: 'train', 'val' or 'test'")
  if precompile_workers < 0:
    raise ValueError(f"--precompile_workers={precompile_workers} must be >= 0 (0: off)")
  config, run, data, state, step, folder = restore_run(workdir, which, step, config)
  report_split_truncation(split, getattr(data, split), run.model.max_length)
  parallel = make_parallel(run.train.parallelism)
  _, p_eval = parallel.steps(state.apply_fn)
  limit = run.eval.num_test_steps if split == "test" else run.eval.num_eval_steps
  params_repl = parallel.put_state(state.params)
  if precompile_workers:
    start = time.time()
    p_eval = precompile.precompile_eval_step(p_eval, params_repl,
                                             [(getattr(data, split), limit)], config,
                                             precompile_workers, parallel)
    print(f"precompiled {len(p_eval.compiled)} eval step shapes in "
          f"{time.time() - start:.1f} s ({precompile_workers} threads)", file=sys.stderr)
  metrics = evaluation.evaluate(p_eval, params_repl, getattr(data, split), config, limit, parallel)
  return {**metrics, "step": step, "split": split, "checkpoint": folder}
