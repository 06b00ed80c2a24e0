"""A ``clu.metric_writers.MetricWriter`` that logs to Weights & Biases.

:class:`simpletron_jax.run.metric_logging.MetricLogger` adds it to its writers when
``config.wandb.project`` is set, on process 0 only. Scalars are logged with the optimizer step
as their x-axis (``define_metric``: W&B's own ``_step`` only counts calls, and would drop a
record whose step is lower than an earlier one, such as the ``test`` record at the
best-validation step); hyperparameters go to the run's config. Its files go under
``<directory>/wandb`` (``offline-run-<time>-<id>/`` in offline mode, uploaded later with
``wandb sync``). A resumed run passes the same run id, so W&B continues the same run.

Importing this module imports clu's ``MetricWriter`` interface without TensorFlow
(:func:`simpletron_jax.run.tensorboard_writer.clu_interface`); ``wandb`` is imported when a writer
is created.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from simpletron_jax.runtime import errors
from simpletron_jax.run.tensorboard_writer import ScalarWriter

STEP_KEY = "step"   # the x-axis of every logged metric


class WandbWriter(ScalarWriter):
  """Logs scalars, texts and hyperparameters to a W&B run; other kinds are skipped with a
  warning (the project writes none).

  Args:
    project: the W&B project (``config.wandb.project``).
    entity: the W&B user or team; "" for the account's default (``config.wandb.entity``).
    mode: ``"online"`` or ``"offline"`` (``config.wandb.mode``); ``""`` or None: W&B's own
      choice (its ``WANDB_MODE`` environment variable, online when unset).
    run_id: the W&B run id: the same on every start of a run (see
      :func:`simpletron_jax.run.metric_logging.wandb_run_id`), so a resumed run continues it.
    directory: the run directory; W&B's files go under ``directory/wandb``.
    name: the run's display name; None: W&B picks one.

  Attributes:
    run_dir: this start's W&B folder, ``directory/wandb/<offline-run|run>-<time>-<run_id>``.

  Raises:
    ValueError: ``mode`` is not '', online or offline (names ``config.wandb.mode``).
    errors.StartError: wandb is not installed (says ``pip install -e ".[wandb]"``), or
      ``wandb.init`` failed (not logged in, no network, ...): the message has W&B's cause.
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
          # mode None: W&B reads WANDB_MODE (a set variable is honoured).
          project=project, entity=entity or None, mode=mode or None, id=run_id,
          resume="allow",
          dir=directory, name=name,
          # Leave stdout and stderr alone: the run prints its own progress and errors.
          settings=wandb.Settings(console="off"))
    except Exception as e:  # pylint: disable=broad-except  # any failure of W&B's start
      raise errors.StartError(
          f"could not start the W&B run {run_id} (config.wandb.project={project!r}, "
          f"mode={mode!r}): {str(e).rstrip('.')}. Log in (`wandb login`), or set "
          "--config.wandb.mode=offline and upload later with `wandb sync`, or "
          "--config.wandb.project='' to log without W&B") from e
    self._run.define_metric(STEP_KEY)
    self._run.define_metric("*", step_metric=STEP_KEY)
    # <directory>/wandb/<offline-run or run>-<time>-<id>: the run's .wandb log, logs/, files/
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
    """Sets ``hparams`` (a flat mapping, e.g. :func:`metric_logging.flat_config`) in the
    run's config; a resumed run may change them (``allow_val_change``)."""
    if self._run is not None:
      self._run.config.update(dict(hparams), allow_val_change=True)

  def flush(self) -> None:
    """Nothing to do: ``run.log`` hands each row to W&B's service process, which writes it."""

  def close(self) -> None:
    """Finishes the W&B run (online: waits for the upload); later calls do nothing. A
    failure of W&B's shutdown is a warning (:class:`errors.RunWarning`), not an error: the
    run's own files are already written."""
    run, self._run = self._run, None
    if run is None:
      return
    try:
      run.finish()
    except Exception as e:  # pylint: disable=broad-except
      errors.warn(f"W&B run {run.id} did not finish cleanly: {e}")
