"""Metrics to ``metrics.jsonl``, TensorBoard and (with ``config.wandb.project``) W&B, through
writers with clu's ``MetricWriter`` interface, and the parameter table (docs/runs.md). The
writers are imported only when a logger is created: importing this module needs no JAX."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sys
import time
import warnings
from typing import Any, Mapping

from simpletron_jax.runtime import atomic_io, errors

WANDB_MODES = ("", "online", "offline")
PARAMETER_OVERVIEW_FILE = "parameter_overview.txt"


def read_records(path: str) -> list[dict[str, Any]]:
  """The records of a ``metrics.jsonl`` file; a torn last line (no newline: a run killed while
  writing it) is dropped with a warning.

  Raises:
    ValueError: ``{path}:{line}: ...``, a line that is not a JSON object with an int ``step``.
  """
  with open(path) as f:
    lines = f.read().split("\n")
  records = []
  for i, line in enumerate(lines):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
      if not isinstance(record, dict) or not isinstance(record.get("step"), int):
        raise ValueError("not a JSON object with an integer 'step'")
    except ValueError as e:
      if i == len(lines) - 1:
        warnings.warn(f"{path}:{i + 1}: dropping a torn last record ({e})", stacklevel=2)
        continue
      raise ValueError(f"{path}:{i + 1}: {e}") from None
    records.append(record)
  return records


def _strict(record: Mapping[str, Any]) -> dict[str, Any]:
  """``record`` with NaN and infinite floats replaced by None (JSON ``null``)."""
  return {k: None if isinstance(v, float) and not math.isfinite(v) else v
          for k, v in record.items()}


def flat_config(config: Any) -> dict[str, bool | int | float | str]:
  """``config`` (a ``ConfigDict`` or nested mapping) as hyperparameters, one per leaf by dotted
  path: ``{"model.num_layers": 4, ...}``. Bools, ints, floats and strings are kept, None is ""
  and anything else its JSON text (TensorBoard's hparams plugin takes only those four types).
  """
  tree = config.to_dict() if hasattr(config, "to_dict") else config
  flat = {}

  def visit(prefix: str, node: Any) -> None:
    if isinstance(node, Mapping):
      for key, value in node.items():
        visit(f"{prefix}.{key}" if prefix else str(key), value)
    elif node is None:
      flat[prefix] = ""
    elif isinstance(node, (bool, int, float, str)):
      flat[prefix] = node
    else:
      flat[prefix] = json.dumps(node, default=str)

  visit("", tree)
  return flat


@dataclasses.dataclass(frozen=True)
class WandbConfig:
  """``config.wandb``: Weights & Biases logging, checked by :meth:`validate`.

  Attributes:
    project: the W&B project; "" (or None): no W&B logging.
    entity: "": the account's default.
    mode: "" (the default): W&B's ``WANDB_MODE`` decides (online when unset); "online",
      "offline" override it.
  """
  project: str = ""
  entity: str = ""
  mode: str = ""

  @classmethod
  def from_config(cls, config: Any) -> "WandbConfig":
    """``config.wandb``'s fields of this class (a config without the section: the defaults;
    other fields are left to their readers, as :class:`RunConfig` leaves them)."""
    section = config.get("wandb") or {}
    return cls(**{f.name: section[f.name] for f in dataclasses.fields(cls) if f.name in section})

  def __post_init__(self):
    for field in dataclasses.fields(self):   # None (an unset ConfigDict field) is ""
      object.__setattr__(self, field.name, str(getattr(self, field.name) or ""))

  def validate(self) -> None:
    """Raises ValueError when ``config.wandb.mode`` is not "", online or offline (even with no
    project)."""
    if self.mode not in WANDB_MODES:
      raise ValueError(f"config.wandb.mode={self.mode!r} is not one of '', online, offline: "
                       "'' (the default) leaves it to W&B's WANDB_MODE variable (online when "
                       "unset), 'online' logs to the W&B server as the run goes, 'offline' "
                       "writes workdir/wandb for a later `wandb sync`")

  def enabled(self) -> bool:
    """Whether a project is set; raises errors.RunError when it is but ``wandb`` is not
    installed."""
    if not self.project:
      return False
    import importlib.util  # pylint: disable=import-outside-toplevel
    if importlib.util.find_spec("wandb") is None:
      raise errors.RunError(f"config.wandb.project={self.project!r} asks for Weights & Biases "
                            "logging, but the wandb package is not installed: run "
                            "pip install -e \".[wandb]\", or set --config.wandb.project='' "
                            "to log to metrics.jsonl and TensorBoard only")
    return True


def wandb_run_id(workdir: str, run_id: str | None = None) -> str:
  """The W&B run id of ``workdir``, the same on every start, so a resumed run continues it:
  ``run_id`` (the run's lineage id) if given, else ``workdir/run_id``'s, else the first 32 hex
  digits of the sha256 of the workdir's absolute path."""
  if run_id:
    return run_id
  path = os.path.join(workdir, "run_id")
  if os.path.exists(path):
    with open(path) as f:
      saved = f.read().strip()
    if saved:
      return saved
  return hashlib.sha256(os.path.abspath(workdir).encode()).hexdigest()[:32]


def write_parameter_overview(workdir: str, params: Any) -> str:
  """Prints ``clu.parameter_overview``'s table of ``params`` to stderr and writes it to
  ``workdir/parameter_overview.txt`` (atomically); returns it: one row per parameter (path,
  shape, dtype, size, mean, std), then ``Total: N -- B bytes``.

  Raises:
    errors.WriteError: the file could not be written (named).
  """
  from clu import parameter_overview  # pylint: disable=import-outside-toplevel
  text = parameter_overview.get_parameter_overview(params)
  print(text, file=sys.stderr)
  atomic_io.write_text_atomic(os.path.join(workdir, PARAMETER_OVERVIEW_FILE), text + "\n")
  return text


class MetricLogger:
  """Writes ``{"step", "split", "time", **metrics}`` lines to ``workdir/metrics.jsonl``
  (``path``) and the same scalars as ``split/name`` to TensorBoard (``workdir/tb``; this
  start's event file is ``tb_path``, None when disabled) and W&B (``workdir/wandb``).

  On a resume the JSONL file drops the records after ``resume_step`` and the ``info`` record
  at it (rewritten atomically), and the new event file starts with TensorBoard's restart
  marker at ``resume_step + 1``: a resumed run shows one value per step and split.

  Args:
    workdir: run directory; must exist.
    resume_step: the optimizer step the run restarts from (0 for a new run).
    enabled: False on non-zero hosts: nothing is written or imported.
    hparams: the hyperparameters (:func:`flat_config`); None: none written.
    wandb: the checked :class:`WandbConfig`; None: no W&B.
    run_id: the run's lineage id, the W&B run id (:func:`wandb_run_id`).

  Raises:
    ValueError: a damaged ``metrics.jsonl`` record.
    errors.RunError: W&B is asked for but not installed, or its run cannot start.
    errors.WriteError: naming a file not written, here or in :meth:`write`, :meth:`close`.
  """

  def __init__(self, workdir: str, resume_step: int = 0, enabled: bool = True,
               hparams: Mapping[str, Any] | None = None, wandb: WandbConfig | None = None,
               run_id: str | None = None):
    self.enabled = enabled
    self.workdir = workdir
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.tb_path = None
    self._file, self._writers = None, []
    if not enabled:
      return
    wandb_on = wandb is not None and wandb.enabled()   # checked before any file is touched
    if os.path.exists(self.path):
      kept = [json.dumps(_strict(r), allow_nan=False) + "\n"
              for r in read_records(self.path) if r["step"] < resume_step
              or (r["step"] == resume_step and r.get("split") != "info")]
      atomic_io.write_text_atomic(self.path, "".join(kept))
    try:   # unbuffered: a failed append is cut back at once (:meth:`write`)
      self._file = open(self.path, "ab", buffering=0)  # pylint: disable=R1732
    except OSError as e:
      raise atomic_io.write_error(self.path, e) from e
    try:
      from simpletron_jax.run.tensorboard_writer import TensorBoardWriter  # pylint: disable=C0415
      tensorboard = TensorBoardWriter(os.path.join(workdir, "tb"), start_step=resume_step + 1)
      self._writers.append(tensorboard)
      self.tb_path = tensorboard.path
      if wandb_on:
        from simpletron_jax.run.wandb_writer import WandbWriter  # pylint: disable=C0415
        self._writers.append(WandbWriter(
            project=wandb.project, entity=wandb.entity, mode=wandb.mode,
            run_id=wandb_run_id(workdir, run_id), directory=workdir,
            name=os.path.basename(os.path.abspath(workdir))))
      if hparams is not None:
        for writer in self._writers:
          writer.write_hparams(hparams)
          writer.flush()
    except BaseException:
      self._close_quietly()
      raise

  def write(self, step: int, metrics: Mapping[str, float], split: str) -> None:
    """Logs scalar ``metrics`` of ``split`` ("train", "val", "test", "info") at ``step``; the
    JSONL line and the TensorBoard events are handed to the OS before it returns. NaN and inf
    are JSON ``null`` (the file stays strict JSON) and floats for TensorBoard and W&B.

    Raises:
      errors.WriteError: naming the file not written; the records before are kept.
    """
    if not self.enabled:
      return
    now = time.time()
    record = {"step": int(step), "split": split, "time": now,
              **{k: float(v) for k, v in metrics.items()}}
    line = (json.dumps(_strict(record), allow_nan=False) + "\n").encode("utf-8")
    atomic_io.append_whole(
        self._file, line, os.fstat(self._file.fileno()).st_size, self.path,
        f"writing the {split} record of step {int(step)} failed, and the records before it "
        "are kept")
    scalars = {f"{split}/{name}": float(value) for name, value in metrics.items()}
    for writer in self._writers:
      writer.write_scalars(int(step), scalars)
      writer.flush()

  def write_parameter_overview(self, params: Any) -> str | None:
    """:func:`write_parameter_overview` into this workdir; None when disabled."""
    return write_parameter_overview(self.workdir, params) if self.enabled else None

  def close(self) -> None:
    """Flushes and closes every output (the W&B run is finished); later calls do nothing.

    Raises:
      errors.WriteError: a final flush failed (everything is closed anyway).
    """
    file, writers, self._file, self._writers = self._file, self._writers, None, []
    failure = None
    if file is not None:
      try:
        file.close()
      except OSError as e:
        failure = atomic_io.write_error(self.path, e)
    for writer in writers:
      try:
        writer.close()
      except errors.WriteError as e:
        failure = failure or e
    if failure is not None:
      raise failure

  def _close_quietly(self) -> None:
    """Closes every output, ignoring errors: after a failure."""
    file, writers, self._file, self._writers = self._file, self._writers, None, []
    for handle in (file, *writers):
      try:
        if handle is not None:
          handle.close()
      except Exception:  # pylint: disable=broad-except
        pass
