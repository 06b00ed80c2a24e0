"""Checkpoints of parameters alone, used outside the run that saved them.

:func:`verify_params_checkpoint` checks a run's newest ``best/`` checkpoint before its
parameters are copied into another model (``init_from``), as
:func:`simpletron_jax.train.checkpoints.restore_checkpoint` checks one it restores.
:func:`save_params_checkpoint` writes parameters made outside a run (an imported BERT) as a
run's ``best/`` holds them, in this release's :data:`simpletron_jax.train.checkpoints.FORMAT`.
"""

from __future__ import annotations

import os
from typing import Any

import orbax.checkpoint as ocp

from simpletron_jax.runtime import errors
from simpletron_jax.train import run_guard
from simpletron_jax.train.checkpoints import (
    FORMAT,
    FORMAT_KEY,
    check_format,
    first_line,
    quiet_abandoned_reads,
    step_dir,
)


def verify_params_checkpoint(directory: str, what: str) -> int:
  """Checks the newest checkpoint of ``directory`` before its parameters are used elsewhere
  (``init_from``, :mod:`simpletron_jax.model.transfer`), as
  :func:`checkpoints.restore_checkpoint` checks one it restores: its arrays load, match the
  CRC-32 saved with them, and are finite.

  Without a train state to restore into, the arrays are read as saved, and their
  ``params_crc32`` (the CRC-32 of the parameters) is compared.

  Args:
    directory: a checkpoint folder (``<workdir>/best``).
    what: the setting that names it, for messages (``"init_from='runs/a'"``).

  Returns:
    The step checked.

  Raises:
    FileNotFoundError: the folder holds no checkpoint.
    errors.CheckpointError: the checkpoint is damaged (unreadable, another CRC-32, NaN or
      inf), naming its folder and what to do.
    errors.ConfigMismatchError: an earlier release saved it (:func:`checkpoints.check_format`).
  """
  quiet_abandoned_reads()
  with ocp.CheckpointManager(os.path.abspath(directory)) as manager:
    step = manager.latest_step()
    if step is None:
      raise FileNotFoundError(f"{what}: no checkpoint in {directory}")
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
  problem = None
  if run_guard.state_crc32(tree["params"]) != meta["params_crc32"]:
    problem = "its parameters do not match the CRC-32 saved with them"
  if problem is None and not run_guard.tree_is_finite(tree["params"]):
    problem = "its parameters hold NaN or inf"
  if problem:
    raise errors.CheckpointError(f"{what}: damaged checkpoint {where}: {problem}. Use an "
                                 "intact run or retrain it.")
  return step


def save_params_checkpoint(directory: str, params: Any, meta: dict[str, Any]) -> None:
  """Writes ``params`` alone as step 0 of a new checkpoint folder, as a run's ``best/`` holds
  them: ``{"params": params}`` and a JSON ``meta`` with :data:`checkpoints.FORMAT_KEY` and
  ``params_crc32`` added, so that :func:`verify_params_checkpoint` checks it and
  :func:`simpletron_jax.model.transfer.load_run_params` reads it (``init_from``). For
  parameters made outside a run, such as an imported BERT
  (:func:`simpletron_jax.tools.bert_import.save_as_run`).

  Args:
    directory: the checkpoint folder (``<out_dir>/best``); created.
    params: a nested dict of arrays.
    meta: what to record beside them (JSON-serialisable).

  Raises:
    errors.NonFiniteError: ``params`` hold NaN or inf; nothing is written.
    errors.CheckpointError: naming ``directory``, when the save fails (e.g. a read-only
      folder) or orbax skips it because the folder already holds a checkpoint.
  """
  if not run_guard.tree_is_finite(params):
    raise errors.NonFiniteError(f"{directory}: the parameters to save hold NaN or inf")
  meta = {**meta, FORMAT_KEY: FORMAT, "params_crc32": run_guard.state_crc32(params)}
  try:
    with ocp.CheckpointManager(os.path.abspath(directory),
                               options=ocp.CheckpointManagerOptions(create=True)) as manager:
      saved = manager.save(0, args=ocp.args.Composite(
          state=ocp.args.StandardSave({"params": params}), meta=ocp.args.JsonSave(meta)))
      manager.wait_until_finished()
  except Exception as e:  # any failure of the library or the file system
    raise errors.CheckpointError(
        f"saving the parameters to {directory} failed: {type(e).__name__}: "
        f"{first_line(e)}") from e
  if not saved:
    raise errors.CheckpointError(f"orbax skipped saving the parameters to {directory}: the "
                                 "folder already holds a checkpoint; use a new folder")
