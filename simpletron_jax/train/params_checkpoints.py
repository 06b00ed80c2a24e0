"""A run's parameters alone, read (``init_from``, the experiment scripts) or written (an
imported BERT) outside the run that trains them, checked as a restored checkpoint is."""

from __future__ import annotations

import json
import os
from typing import Any

import orbax.checkpoint as ocp

from simpletron_jax.model import lora
from simpletron_jax.runtime import errors
from simpletron_jax.run import run_guard
from simpletron_jax.train.checkpoints import (
    BEST_KEY,
    FORMAT,
    FORMAT_KEY,
    check_format,
    checkpoint_manager,
    first_line,
    pick_step,
    quiet_abandoned_reads,
    step_dir,
)


def load_params(workdir: str, which: str = "best", what: str | None = None) -> Any:
  """The parameters of a run's ``which`` checkpoint (``"best"`` or ``"latest"``) as saved (numpy),
  checked to load, match their ``params_crc32`` and be finite; a LoRA run's ``{"base", "lora"}``
  tree merged with its ``config.json``'s ``lora.rank`` and ``lora.alpha``.

  Args:
    workdir: a ``train.py`` run's folder, or :func:`save_params_checkpoint`'s ``out_dir``.
    what: names the setting in messages (default ``init_from='<workdir>'``).

  Raises:
    FileNotFoundError: the folder holds no such checkpoint.
    errors.CheckpointError: the checkpoint is damaged (unreadable, another CRC-32, NaN or
      inf), naming its folder and what to do.
    errors.ConfigMismatchError: an earlier release saved it (:func:`checkpoints.check_format`).
  """
  what = what or f"init_from={workdir!r}"
  directory = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"{what}: {workdir} has no checkpoints/ folder")
  quiet_abandoned_reads()
  with checkpoint_manager(directory, None) as manager:
    step = pick_step(manager, which, what)
    where = step_dir(manager, step)
    try:
      meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
      tree = manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore()))["state"]
    except Exception as e:  # a damaged checkpoint fails in many ways; each is named
      raise errors.CheckpointError(
          f"{what}: damaged checkpoint {where}: {type(e).__name__}: {first_line(e)}. Use an "
          "intact run (eval.py --workdir on it checks one) or retrain it.") from e
  check_format(meta, f"{what}: {where}")
  params = tree["params"]
  problem = None
  if run_guard.state_crc32(params) != meta["params_crc32"]:
    problem = "its parameters do not match the CRC-32 saved with them"
  if problem is None and not run_guard.tree_is_finite(params):
    problem = "its parameters hold NaN or inf"
  if problem:
    raise errors.CheckpointError(f"{what}: damaged checkpoint {where}: {problem}. Use an "
                                 "intact run or retrain it.")
  if lora.is_wrapped(params):
    with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
      run_lora = json.load(f)["lora"]
    params = lora.merge(params, lora.scale_of(run_lora["rank"], run_lora["alpha"]))
  return params


def save_params_checkpoint(out_dir: str, params: Any, meta: dict[str, Any]) -> None:
  """Writes ``{"params": params}`` (a nested dict of arrays) and a JSON ``meta`` (with the
  format and ``params_crc32``) as step 0, kept as the best, of ``out_dir/checkpoints``
  (created), for :func:`load_params`.

  Raises:
    errors.NonFiniteError: ``params`` hold NaN or inf; nothing is written.
    errors.CheckpointError: naming the folder, when the save fails (e.g. a read-only folder)
      or orbax skips it because the folder already holds a checkpoint.
  """
  directory = os.path.join(out_dir, "checkpoints")
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
        f"{first_line(e)}") from e
  if not saved:
    raise errors.CheckpointError(f"orbax skipped saving the parameters to {directory}: the "
                                 "folder already holds a checkpoint; use a new folder")
