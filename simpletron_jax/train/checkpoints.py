"""Checkpoints a killed run resumes from, verified before use; orbax keeps the newest and the best.

Each step stores a CRC-32 and the arrays' layout; a restore sets damaged steps aside and
refuses another model config, layout or :data:`FORMAT` in one line (docs/faults.md).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from typing import Any, Callable

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from simpletron_jax.runtime import distributed, errors
from simpletron_jax.run import run_folder, run_guard, run_record
from simpletron_jax.train import checkpoint_faults
from simpletron_jax.train.steps import TrainState

# The checkpoint layout, in each meta under FORMAT_KEY. 3: the newest and the best in one folder.
FORMAT_KEY = "checkpoint_format"
FORMAT = 3
BEST_KEY = "best_score"   # the orbax metric of a save at a new best (:func:`best_score`)


@dataclasses.dataclass
class RunState:
  """What a run carries from one checkpoint to the next: each step's JSON meta, with the
  checks' fields (:func:`save_checkpoint`) added.

  Attributes:
    best_score, best_step, best_val_accuracy: the best validation so far (:func:`best_score`;
      None, -1 and -1.0 before the first).
    train_seconds: training seconds over all starts (``loop.TrainWindow``).
    val_majority_rate: the last validation's majority-class rate (None before the first).
    run_id: the lineage id (``RunFolder.run_id``); model_config: ``config.model`` as JSON.
    run_record: the saving start's ``run_record.run_record``, compared on a resume.
  """
  best_score: float | None = None
  best_step: int = -1
  best_val_accuracy: float = -1.0
  train_seconds: float = 0.0
  val_majority_rate: float | None = None
  run_id: str | None = None
  model_config: dict[str, Any] | None = None
  run_record: dict[str, Any] | None = None

  @classmethod
  def from_meta(cls, meta: dict[str, Any]) -> RunState:
    """The state in a checkpoint's meta (the checks' fields left out)."""
    return cls(**{f.name: meta[f.name] for f in dataclasses.fields(cls) if f.name in meta})

  def to_meta(self) -> dict[str, Any]:
    """The JSON meta to save (no ``val_majority_rate`` before the first validation)."""
    meta = dataclasses.asdict(self)
    if self.val_majority_rate is None:
      del meta["val_majority_rate"]
    return meta

  def new_best(self, step: int, score: float, val_accuracy: float) -> bool:
    """Records a validation of ``score`` at ``step`` if it beats the best (the first wins
    ties); returns whether it did."""
    if self.best_score is not None and score <= self.best_score:
      return False
    self.best_score, self.best_step, self.best_val_accuracy = score, step, val_accuracy
    return True


def _ckpt_tree(state: TrainState, private_copy: bool = False) -> dict[str, Any]:
  """Step, params and optimizer state as host numpy arrays (orbax refuses ``pmap``'s
  host-local arrays on several hosts); ``private_copy``: fresh copies, for a background save."""
  tree = jax.device_get({"step": state.step, "params": state.params,
                         "opt_state": state.opt_state})
  if private_copy:
    tree = jax.tree_util.tree_map(lambda x: np.array(x, copy=True), tree)
  return tree


class Manager(ocp.CheckpointManager):
  """orbax's manager, knowing whether it saves in the background (``async_save``) and which
  step's background save is not yet confirmed (``pending``), so a failure names its step."""

  async_save: bool = False
  pending: int | None = None


def check_async_supported(async_save: bool, process_count: int) -> None:
  """Refuses ``async_save`` (``config.async_checkpoints``) with ``process_count > 1``: a failed
  background write on process 0 would leave the others waiting at orbax's commit barrier.

  Raises:
    ValueError: naming ``config.async_checkpoints``.
  """
  if async_save and process_count > 1:
    raise ValueError(
        f"config.async_checkpoints=True is not supported on several processes (this run has "
        f"{process_count}): set config.async_checkpoints=False (docs/faults.md, "
        "\"Asynchronous checkpoint saves\")")


def _best_fn(metrics: dict[str, float]) -> float:
  return metrics.get(BEST_KEY, -math.inf)


def checkpoint_manager(directory: str, max_to_keep: int | None,
                       async_save: bool = False) -> Manager:
  """An orbax manager of ``directory`` (created) keeping the newest ``max_to_keep`` steps (None:
  all) and, by ``BestN(n=1)``, the best: of the saves at a new best, which alone carry the
  :data:`BEST_KEY` metric, the newest. ``async_save``: orbax writes in a background thread.
  A step orbax could not list is first moved to the run folder's ``damaged/``, beside
  ``directory`` (:func:`set_aside_unlisted_steps`).

  Raises:
    ValueError: ``async_save`` on several processes (:func:`check_async_supported`).
  """
  check_async_supported(bool(async_save), jax.process_count())
  # A failed save is reported once, by save_checkpoint or finish_saves: not by orbax's write
  # threads' log records, nor by the writes tensorstore then abandons (each hook added once).
  checkpoint_faults.quiet_reported_failures()
  checkpoint_faults.set_aside_unlisted_steps(directory, os.path.join(
      os.path.dirname(os.path.abspath(directory)), run_folder.DAMAGED_DIR))
  keep = ocp.checkpoint_managers.AnyPreservationPolicy([
      ocp.checkpoint_managers.LatestN(n=max_to_keep),
      ocp.checkpoint_managers.BestN(get_metric_fn=_best_fn, n=1)])
  manager = Manager(
      os.path.abspath(directory),
      options=ocp.CheckpointManagerOptions(
          create=True, best_fn=_best_fn, best_mode="max", preservation_policy=keep,
          enable_async_checkpointing=bool(async_save)))
  manager.async_save = bool(async_save)
  return manager


def best_score(val: dict[str, float], metric: str, mode: str) -> float:
  """The validation ``val``'s ``metric``, signed so that higher is better (``mode``: ``"max"``
  or ``"min"``; ``config.best_metric``, ``config.best_mode``)."""
  return float(val[metric]) if mode == "max" else -float(val[metric])


def pick_step(manager: ocp.CheckpointManager, which: str, what: str) -> int:
  """The step ``which`` names, ``"best"`` or ``"latest"``.

  Raises:
    FileNotFoundError: naming ``what`` (the folder or setting), when there is none; without a
      best-validation checkpoint, it names the newest step and ``eval.py --which latest``.
  """
  step = manager.best_step() if which == "best" else manager.latest_step()
  if step is None or (which == "best" and BEST_KEY not in (manager.metrics(step) or {})):
    newest = manager.latest_step() if which == "best" else None
    hint = (f"; the newest checkpoint is step {newest} (eval.py --which latest scores it)"
            if newest is not None else "")
    raise FileNotFoundError(f"{what}: no {'best-validation ' if which == 'best' else ''}"
                            f"checkpoint in {manager.directory}{hint}")
  return step


def finish_saves(*managers: ocp.CheckpointManager) -> None:
  """Waits until every save started in ``managers`` is written (no-op for synchronous ones).

  Raises:
    errors.CheckpointError: naming the step folder whose background save failed or is missing
      after orbax reported success; the steps saved before it are kept.
  """
  for manager in managers:
    step, manager.pending = getattr(manager, "pending", None), None
    where = step_dir(manager, step) if step is not None else str(manager.directory)
    try:
      if step is not None:   # a signal that stops at once lands here, not in orbax's wait
        checkpoint_faults.join_save_threads()
      manager.wait_until_finished()
    except Exception as e:  # a failed background write, of any kind, stops the run
      checkpoint_faults.abandon_save(manager, step)
      raise errors.CheckpointError(
          f"the background save of step {step} to {where} failed: "
          f"{checkpoint_faults.save_failure(e)}. The checkpoints saved before it are kept.") from e
    except BaseException:   # a second SIGTERM or Ctrl-C: no save, and no orbax thread left
      checkpoint_faults.abandon_save(manager, step)
      raise
    if (step is not None and step in manager.all_steps() and jax.process_index() == 0
        and not os.path.isdir(where)):
      raise errors.CheckpointError(
          f"the background save of step {step} to {where} ended without the folder: orbax "
          "reported no error but did not finish the checkpoint")


def check_format(meta: dict[str, Any], where: str) -> None:
  """Refuses a checkpoint whose JSON ``meta`` is not of :data:`FORMAT`.

  Raises:
    errors.ConfigMismatchError: one line naming ``where``, both formats and what to do.
  """
  if meta.get(FORMAT_KEY) != FORMAT:
    raise errors.ConfigMismatchError(
        f"{where} was saved by an earlier release of simpletron-jax (checkpoint format "
        f"{meta.get(FORMAT_KEY, 1)}, this release reads {FORMAT}) and cannot be resumed, "
        "evaluated or transferred: train again in a new --workdir, or use the release that "
        "saved it.")


def model_config_dict(model_config) -> dict[str, Any]:
  """``config.model`` as the plain JSON dict that checkpoints record (references resolved)."""
  if isinstance(model_config, ml_collections.ConfigDict):
    model_config = model_config.to_dict()
  return json.loads(json.dumps(model_config))


def step_dir(manager: ocp.CheckpointManager, step: int) -> str:
  """The folder of ``step`` in ``manager``'s directory (named in messages)."""
  return os.path.join(str(manager.directory), str(step))


def save_checkpoint(manager: ocp.CheckpointManager, step: int, state: TrainState,
                    meta: dict[str, Any], best: float | None = None) -> None:
  """Saves the unreplicated ``state`` and a JSON ``meta`` dict at optimizer ``step``; ``best``:
  the step is a new best validation of that :func:`best_score` (the manager keeps it).

  ``meta`` gets :data:`FORMAT_KEY`, ``state_crc32`` (params and optimizer state),
  ``params_crc32`` and ``state_structure`` (:mod:`run_guard`), which the restores verify. An
  asynchronous manager first waits for its previous save, then returns once orbax holds a
  private host copy of ``state``; the step folder appears only when the write has finished.

  Raises:
    errors.NonFiniteError: ``state`` holds NaN or inf; nothing is saved.
    errors.CheckpointError: naming the folder and the reason: the save failed, orbax skipped
      it (the folder holds a later step), or the previous background save failed.
  """
  async_save = getattr(manager, "async_save", False)
  if async_save:
    finish_saves(manager)   # orbax would wait anyway; this names a failed previous step
  tree = _ckpt_tree(state, private_copy=async_save)
  where = step_dir(manager, step)
  if not run_guard.tree_is_finite(tree):
    raise errors.NonFiniteError(f"refusing to save a state with NaN or inf to {where}")
  arrays = (tree["params"], tree["opt_state"])
  params_crc = run_guard.state_crc32(tree["params"])
  meta = {**meta, FORMAT_KEY: FORMAT,
          "state_crc32": run_guard.state_crc32(tree["opt_state"], params_crc),
          "params_crc32": params_crc, "state_structure": run_guard.state_structure(arrays)}
  try:
    saved = manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(tree),
                                                       meta=ocp.args.JsonSave(meta)),
                         metrics={} if best is None else {BEST_KEY: best})
    if not async_save:
      manager.wait_until_finished()
  except Exception as e:  # any failure of the library or the file system stops the run
    checkpoint_faults.abandon_save(manager, step)
    raise errors.CheckpointError(
        f"saving step {step} to {where} failed: {checkpoint_faults.save_failure(e)}") from e
  except BaseException:   # a second SIGTERM or Ctrl-C stops the run at once, without this save
    checkpoint_faults.abandon_save(manager, step)
    raise
  if saved and async_save:
    manager.pending = step
  if not saved:
    raise errors.CheckpointError(
        f"orbax skipped saving step {step} to {manager.directory}: the folder holds step "
        f"{manager.latest_step()}, and orbax only saves newer steps")


def _as_32_bit(leaf):
  """A ``ShapeDtypeStruct`` leaf with JAX_ENABLE_X64's 64-bit dtypes as the 32-bit ones."""
  if not hasattr(leaf, "dtype"):
    return leaf
  dtype = {np.dtype(np.float64): np.float32, np.dtype(np.int64): np.int32,
           np.dtype(np.uint64): np.uint32}.get(np.dtype(leaf.dtype), leaf.dtype)
  return jax.ShapeDtypeStruct(leaf.shape, dtype)


def _restore_verified(manager: ocp.CheckpointManager, state: TrainState, step: int,
                      model_config, resume_check=None) -> tuple[TrainState, dict[str, Any], int]:
  """Restores one step and checks its model config (or calls ``resume_check``), layout, CRC
  and finiteness (see :func:`restore_checkpoint`)."""
  where = step_dir(manager, step)
  meta = dict(manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"])
  check_format(meta, where)
  diff = []
  if model_config is not None and "model_config" in meta:
    diff = run_record.flat_diff(meta["model_config"], model_config_dict(model_config))
  if resume_check is not None:
    resume_check(where, meta, diff)
  elif diff:
    raise errors.ConfigMismatchError(
        f"{where} was saved with another model config: {'; '.join(diff)}. Resume with the "
        "checkpoint's values, or use another --workdir.")
  target = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, _ckpt_tree(state))
  structure = run_guard.state_structure((target["params"], target["opt_state"]))
  if meta["state_structure"] != structure:
    # Not damage: restoring would fail, and the checkpoint would be set aside as damaged.
    if jax.config.jax_enable_x64 and meta["state_structure"] == run_guard.state_structure(
        jax.tree_util.tree_map(_as_32_bit, (target["params"], target["opt_state"]))):
      raise errors.ConfigMismatchError(
          f"{where} holds 32-bit arrays, but JAX_ENABLE_X64 is set here, which makes this "
          "run's float32 and int32 parameters and optimizer state 64-bit: unset "
          "JAX_ENABLE_X64 to resume it, or use another --workdir.")
    raise errors.ConfigMismatchError(
        f"{where} holds a train state of another layout: the parameter shapes (the task's "
        "vocabulary size and class count, model sizes) or the optimizer settings that change "
        "it (grad_accum_steps > 1, grad_clip_norm > 0, freeze, lora.rank) differ from the "
        "checkpoint's. Resume with the values in the workdir's config.json, or use another "
        "--workdir.")
  tree = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(target)))["state"]
  crc = run_guard.state_crc32((tree["params"], tree["opt_state"]))
  if crc != meta["state_crc32"]:
    raise errors.CheckpointError("its arrays do not match the CRC-32 saved with them")
  if not run_guard.tree_is_finite(tree):
    raise errors.NonFiniteError("it holds NaN or inf")
  state = state.replace(step=tree["step"], params=tree["params"], opt_state=tree["opt_state"])
  return state, meta, step


def _quarantine(manager: ocp.CheckpointManager, step: int, quarantine_dir: str) -> str:
  """Moves a damaged step folder out of the manager's directory (process 0; the other hosts,
  which found the same damage, wait for it); returns its new path."""
  target = os.path.join(quarantine_dir, f"{os.path.basename(str(manager.directory))}_{step}")
  if jax.process_index() == 0:
    os.makedirs(quarantine_dir, exist_ok=True)
    target += f"_{time.strftime('%Y%m%d-%H%M%S')}"
    shutil.move(step_dir(manager, step), target)
  distributed.barrier(f"quarantine_{step}")
  manager.reload()
  return target


def restore_checkpoint(manager: ocp.CheckpointManager, state: TrainState,
                       step: int | None = None, model_config=None,
                       quarantine_dir: str | None = None,
                       resume_check: Callable[[str, dict, list[str]], None] | None = None
                       ) -> tuple[TrainState, dict[str, Any], int]:
  """Restores ``step`` (default: the newest intact one) into the structure of ``state``.

  A checkpoint is intact when its meta loads and its arrays load into ``state``'s structure,
  match the CRC-32 saved with them and are finite. With ``step=None`` one that is not is
  skipped with a :class:`errors.RunWarning`, moved to ``quarantine_dir`` when given, and the
  next older one is tried.

  Args:
    step: restore exactly this optimizer step (no fallback).
    model_config: ``config.model``; a checkpoint of another is an error, not damage.
    quarantine_dir: where damaged checkpoints go; None: they stay.
    resume_check: ``resume_check(folder, meta, model_diff)``, called before the arrays are
      read in place of the ``model_config`` check; raises :class:`errors.ConfigMismatchError`
      to refuse the checkpoint (the trainer compares the whole run record there).

  Returns:
    ``(state, meta, step)``.

  Raises:
    FileNotFoundError: the folder holds no checkpoint, or not ``step``.
    errors.ConfigMismatchError: listing every ``model.*`` field that differs; or, in one
      line, a checkpoint of another :data:`FORMAT` (an earlier release's).
    errors.CheckpointError: ``step`` is damaged, no checkpoint is intact (each named), or a
      background save failed (:func:`finish_saves`).
  """
  finish_saves(manager)   # an asynchronous save of this manager is read only once written
  checkpoint_faults.quiet_abandoned_reads()   # a damaged step is reported once, below
  available = sorted(manager.all_steps(), reverse=True)
  if not available or (step is not None and step not in available):
    raise FileNotFoundError(f"no checkpoint{'' if step is None else f' at step {step}'} in "
                            f"{manager.directory} (it holds steps {sorted(available)})")
  problems = []
  for candidate in ([step] if step is not None else available):
    try:
      return _restore_verified(manager, state, candidate, model_config, resume_check)
    except errors.ConfigMismatchError:
      raise
    except Exception as e:  # a damaged checkpoint fails in many ways; each is reported
      problem = (f"{step_dir(manager, candidate)}: {type(e).__name__}: "
                 f"{checkpoint_faults.first_line(e)}")
      if step is not None:
        raise errors.CheckpointError(f"damaged checkpoint {problem}") from e
      problems.append(problem)
      moved = _quarantine(manager, candidate, quarantine_dir) if quarantine_dir else None
      errors.warn(f"skipping damaged checkpoint {problem}"
                     + (f"; moved to {moved}" if moved else ""))
  raise errors.CheckpointError(f"no intact checkpoint in {manager.directory}: "
                                  + " | ".join(problems))


def check_best(manager: ocp.CheckpointManager, state: RunState) -> RunState:
  """Makes ``state``'s best a step the manager holds: when a damaged best step was set aside,
  the best kept step becomes the best so far (or none is), with a warning. Returns ``state``."""
  missing = state.best_step
  if missing < 0 or missing in manager.all_steps():
    return state
  step = manager.best_step()
  if step is not None and BEST_KEY in (manager.metrics(step) or {}):
    kept = RunState.from_meta(
        manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"])
    state.best_step, state.best_score = kept.best_step, kept.best_score
    state.best_val_accuracy = kept.best_val_accuracy
  else:
    state.best_step, state.best_score, state.best_val_accuracy = -1, None, -1.0
  errors.warn(f"the best checkpoint of step {missing} is missing from "
              f"{manager.directory}; the best so far is now "
              + (f"step {state.best_step}" if state.best_step >= 0 else "none"))
  return state
