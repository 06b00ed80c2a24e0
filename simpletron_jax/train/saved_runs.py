"""A run's checkpoint read back outside the run that trained it (:func:`load_run`: eval.py,
``scripts/explain.py``, ``init_from``, the experiment scripts), or parameters saved as a run
(:func:`save_params`: an imported BERT), checked as a resume checks a checkpoint."""

from __future__ import annotations

import os
import sys
from typing import Any

import jax
import ml_collections
import orbax.checkpoint as ocp

from simpletron_jax.data import tasks
from simpletron_jax.model import lora, transfer
from simpletron_jax.runtime import errors
from simpletron_jax.run import run_guard
from simpletron_jax.run.run_folder import RunFolder
from simpletron_jax.train import checkpoint_faults, checkpoints, train_state
from simpletron_jax.train.checkpoints import BEST_KEY, FORMAT, FORMAT_KEY, checkpoint_manager
from simpletron_jax.train.run_config import RunConfig, TrainConfig
from simpletron_jax.train.steps import TrainState


class SavedRun:
  """One checkpoint, ``step``, of a run's ``folder`` (:func:`load_run`'s arguments)."""

  def __init__(self, folder: RunFolder, step: int, what: str,
               config: ml_collections.ConfigDict | None = None):
    self.folder, self.step, self.what, self.config = folder, step, what, config
    self.where = os.path.join(folder.checkpoints_dir, str(step))

  def params(self) -> Any:
    """The saved parameters (numpy), checked to load, match their ``params_crc32`` and be
    finite; a LoRA run's ``{"base", "lora"}`` tree merged with ``config.json``'s ``lora``.

    Raises:
      errors.CheckpointError, errors.ConfigMismatchError: damage (CRC-32, NaN; named), or an
        earlier release's format; FileNotFoundError: a LoRA run's ``config.json`` is missing.
    """
    checkpoint_faults.quiet_abandoned_reads()
    try:
      with checkpoint_manager(self.folder.checkpoints_dir, None) as manager:
        meta = manager.restore(self.step, args=ocp.args.Composite(
            meta=ocp.args.JsonRestore()))["meta"]
        tree = manager.restore(self.step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore()))["state"]
    except Exception as e:  # a damaged checkpoint fails in many ways; each is named
      raise errors.CheckpointError(
          f"{self.what}: damaged checkpoint {self.where}: {type(e).__name__}: "
          f"{checkpoint_faults.first_line(e)}. Use an intact run (eval.py --workdir on it checks "
          "one) or retrain it.") from e
    checkpoints.check_format(meta, f"{self.what}: {self.where}")
    params = tree["params"]
    problem = None
    if run_guard.state_crc32(params) != meta["params_crc32"]:
      problem = "its parameters do not match the CRC-32 saved with them"
    if problem is None and not run_guard.tree_is_finite(params):
      problem = "its parameters hold NaN or inf"
    if problem:
      raise errors.CheckpointError(f"{self.what}: damaged checkpoint {self.where}: {problem}. "
                                   "Use an intact run or retrain it.")
    if lora.is_wrapped(params):
      run_lora = self.folder.saved_config().lora
      params = lora.merge(params, lora.scale_of(run_lora.rank, run_lora.alpha))
    return params

  def restore(self) -> tuple[ml_collections.ConfigDict, RunConfig, tasks.TaskData, TrainState]:
    """The run's config, task data and whole train state at :attr:`step`, verified as a resume
    verifies it (:func:`checkpoints.restore_checkpoint`).

    Returns ``(config, run, data, state)``: the ConfigDict, its :class:`RunConfig`, the task
    data and the unreplicated train state.

    Raises:
      FileNotFoundError, ValueError: no ``config.json`` and no ``config``; a bad config field.
      errors.ConfigMismatchError, errors.CheckpointError: another model config; damage.
    """
    config = self.config or self.folder.saved_config()
    run = RunConfig.from_config_dict(config)
    data = tasks.load_task(run.data)
    model = train_state.build_model(run, data)
    state = train_state.create_train_state(run.train, model, jax.random.PRNGKey(0),
                                           run.model.max_length)
    with checkpoint_manager(self.folder.checkpoints_dir, None) as manager:
      state, _, _ = checkpoints.restore_checkpoint(manager, state, self.step,
                                                   model_config=config.model)
    return config, run, data, state


def load_run(workdir: str, which: str = "best", step: int | None = None,
             config: ml_collections.ConfigDict | None = None,
             what: str | None = None) -> SavedRun:
  """The ``which`` checkpoint (``"best"``: best validation, or ``"latest"``) of the run in
  ``workdir``, or its ``step``; nothing is read but ``config.json``'s task and the step list
  (:meth:`SavedRun.params`, :meth:`SavedRun.restore` read the arrays).

  Args:
    config: to restore the run with, in place of its ``config.json`` (the same task).
    what: names the run's setting in messages (default ``--workdir <workdir>``).

  Raises:
    ValueError: an unknown ``which``.
    FileNotFoundError: ``workdir`` is not a folder, or holds no such checkpoint.
    errors.ConfigMismatchError: ``config`` is of another task than the run's.
  """
  what = what or f"--workdir {workdir}"
  if which not in ("best", "latest"):
    raise ValueError(f"which={which!r} not understood: 'best' or 'latest'")
  folder = RunFolder(workdir)
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f"{what}: {workdir!r} is not a folder: pass the workdir of a "
                            "train.py run")
  saved_task = (folder.read_config() or {}).get("task")
  if config is not None and saved_task not in (None, config.task):
    raise errors.ConfigMismatchError(
        f"--config is a config of task {config.task!r}, but {workdir} trained task "
        f"{saved_task!r} ({folder.config_path}): pass a configs/{saved_task}/... config, or "
        "leave --config out to use the run's own")
  if not os.path.isdir(folder.checkpoints_dir):
    raise FileNotFoundError(f"{what}: {folder.checkpoints_dir} not found: the run saved no "
                            "checkpoint yet")
  with checkpoint_manager(folder.checkpoints_dir, None) as manager:
    if step is None:
      step = checkpoints.pick_step(manager, which, what)
    elif step not in manager.all_steps():
      raise FileNotFoundError(f"{what}: no checkpoint at step {step} in {manager.directory} "
                              f"(it holds steps {sorted(manager.all_steps())})")
  return SavedRun(folder, step, what, config)


def apply_init_from(train: TrainConfig, state: TrainState, folder: RunFolder) -> TrainState:
  """``state`` with the parameters of ``train.init_from``'s best checkpoint that match in path
  and shape (and ``train.init_include``; :func:`transfer.transfer_params`), the rest kept;
  the report goes to ``transfer.json`` in ``folder``. Unchanged when ``init_from`` is empty.

  Raises:
    FileNotFoundError: the source run has no best checkpoint.
    ValueError: see :func:`transfer.transfer_params`.
    errors.CheckpointError, errors.ConfigMismatchError: see :meth:`SavedRun.params`.
    errors.WriteError: ``transfer.json`` could not be written (named).
  """
  if not train.init_from:
    return state
  source = load_run(train.init_from, what=f"init_from={train.init_from!r}").params()
  params, report = transfer.init_from_params(state.params, source, train.init_include)
  print(f"init_from {train.init_from}: {report.summary()}", file=sys.stderr)
  folder.write_transfer({"init_from": train.init_from, **report.to_dict()})
  return state.replace(params=params)


def save_params(out_dir: str, params: Any, meta: dict[str, Any]) -> None:
  """Writes ``{"params": params}`` (a nested dict of arrays) and a JSON ``meta`` (with the
  format and ``params_crc32``) as step 0, kept as the best, of ``out_dir/checkpoints``
  (created), for :func:`load_run`.

  Raises:
    errors.NonFiniteError: ``params`` hold NaN or inf; nothing is written.
    errors.CheckpointError: naming the folder: the save failed, or it holds a checkpoint.
  """
  directory = RunFolder(out_dir).checkpoints_dir
  if not run_guard.tree_is_finite(params):
    raise errors.NonFiniteError(f"{directory}: the parameters to save hold NaN or inf")
  meta = {**meta, FORMAT_KEY: FORMAT, "params_crc32": run_guard.state_crc32(params)}
  try:
    with checkpoint_manager(directory, None) as manager:
      saved = manager.save(0, args=ocp.args.Composite(
          state=ocp.args.StandardSave({"params": params}), meta=ocp.args.JsonSave(meta)),
                           metrics={BEST_KEY: 0.0})
      manager.wait_until_finished()
  except Exception as e:  # any failure of the library or the file system
    raise errors.CheckpointError(
        f"saving the parameters to {directory} failed: {type(e).__name__}: "
        f"{checkpoint_faults.first_line(e)}") from e
  if not saved:
    raise errors.CheckpointError(f"orbax skipped saving the parameters to {directory}: the "
                                 "folder already holds a checkpoint; use a new folder")
