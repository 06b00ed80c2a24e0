"""A ``clu.metric_writers.MetricWriter`` that logs to Weights & Biases (docs/runs.md).

The x-axis is the optimizer step (``define_metric``): W&B's ``_step`` counts calls and drops a
record whose step is below an earlier one (the ``test`` record at the best-validation step).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from simpletron_jax.runtime import errors
from simpletron_jax.run.tensorboard_writer import ScalarWriter

STEP_KEY = "step"


class WandbWriter(ScalarWriter):
  """Logs scalars, texts and hparams (the run's config) to a W&B run; skips other kinds.

  Args:
    project, entity, mode: ``config.wandb``'s; entity "": the account's default; mode ""
      or None: W&B's ``WANDB_MODE`` (online when unset).
    run_id: the same on every start (:func:`metric_logging.wandb_run_id`): a resume continues.
    directory: the run directory; ``run_dir``: ``directory/wandb/<offline-run|run>-<time>-<id>``.
    name: the display name; None: W&B picks one.

  Raises:
    ValueError: ``mode`` is not '', online or offline.
    errors.StartError: wandb is not installed, or ``wandb.init`` failed (W&B's cause).
  """

  def __init__(self, *, project: str, entity: str, mode: str | None, run_id: str,
               directory: str, name: str | None = None):
    if mode not in (None, "", "online", "offline"):
      raise ValueError(f"config.wandb.mode={mode!r} is not one of '', online, offline")
    try:
      import wandb  # pylint: disable=import-outside-toplevel
    except ImportError as e:
      raise errors.StartError(
          f"config.wandb.project={project!r} asks for Weights & Biases logging, but wandb "
          "cannot be imported: run pip install -e \".[wandb]\", or set "
          f"--config.wandb.project='' ({e})") from e
    try:
      self._run = wandb.init(
          project=project, entity=entity or None, mode=mode or None, id=run_id,
          resume="allow",
          dir=directory, name=name,
          settings=wandb.Settings(console="off"))
    except Exception as e:  # pylint: disable=broad-except  # any failure of W&B's start
      raise errors.StartError(
          f"could not start the W&B run {run_id} (config.wandb.project={project!r}, "
          f"mode={mode!r}): {str(e).rstrip('.')}. Log in (`wandb login`), or set "
          "--config.wandb.mode=offline and upload later with `wandb sync`, or "
          "--config.wandb.project='' to log without W&B") from e
    self._run.define_metric(STEP_KEY)
    self._run.define_metric("*", step_metric=STEP_KEY)
    self.run_dir = os.path.dirname(self._run.dir)

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Logs ``scalars`` (name -> number) at optimizer step ``step``, as one W&B row."""
    if self._run is None or not scalars:
      return
    row = {name: value.item() if hasattr(value, "item") else value
           for name, value in scalars.items()}
    self._run.log({**row, STEP_KEY: int(step)})

  def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
    """Logs ``texts`` (name -> string) at optimizer step ``step``."""
    if self._run is not None and texts:
      self._run.log({**{k: str(v) for k, v in texts.items()}, STEP_KEY: int(step)})

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    """Sets ``hparams`` (flat, :func:`metric_logging.flat_config`) in the run's config."""
    if self._run is not None:
      self._run.config.update(dict(hparams), allow_val_change=True)

  def flush(self) -> None:
    """Nothing to do: ``run.log`` hands each row to W&B's service process, which writes it."""

  def close(self) -> None:
    """Finishes the W&B run (online: waits for the upload); a failure only warns. Idempotent."""
    run, self._run = self._run, None
    if run is None:
      return
    try:
      run.finish()
    except Exception as e:  # pylint: disable=broad-except
      errors.warn(f"W&B run {run.id} did not finish cleanly: {e}")
