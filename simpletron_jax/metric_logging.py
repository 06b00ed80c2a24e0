"""Metrics to a JSONL file (one record per line, easy to plot) and to TensorBoard."""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from typing import Any, Mapping

from tensorboardX import SummaryWriter


def read_records(path: str) -> list[dict[str, Any]]:
  """The records of a ``metrics.jsonl`` file.

  A torn last line (no newline after it: a run killed while writing it) is dropped with a
  warning.

  Raises:
    ValueError: ``{path}:{line}: ...`` for any other line that is not a JSON object with an
      integer ``step``.
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
      if i == len(lines) - 1:  # no newline after it: the write was cut short
        warnings.warn(f"{path}:{i + 1}: dropping a torn last record ({e})", stacklevel=2)
        continue
      raise ValueError(f"{path}:{i + 1}: {e}") from None
    records.append(record)
  return records


def _strict(record: Mapping[str, Any]) -> dict[str, Any]:
  """``record`` with NaN and infinite floats replaced by None (JSON ``null``)."""
  return {k: None if isinstance(v, float) and not math.isfinite(v) else v
          for k, v in record.items()}


class MetricLogger:
  """Writes ``{"step", "split", "time", **metrics}`` lines to ``workdir/metrics.jsonl``
  and the same scalars to TensorBoard under ``workdir/tb`` as ``split/name``.

  On a resumed run, records with ``step > resume_step`` (written after the
  checkpoint the run resumes from) and the ``info`` record at ``resume_step`` (the run
  writes it again) are dropped from the JSONL file first, so a killed-and-resumed run
  leaves one record per step and split.

  Args:
    workdir: run directory.
    resume_step: the optimizer step the run restarts from (0 for a new run).
    enabled: False on non-zero hosts of a multi-host run; then nothing is
      written.
  """

  def __init__(self, workdir: str, resume_step: int = 0, enabled: bool = True):
    self.enabled = enabled
    self.path = os.path.join(workdir, "metrics.jsonl")
    if not enabled:
      return
    if os.path.exists(self.path):
      kept = [json.dumps(_strict(r), allow_nan=False) + "\n"
              for r in read_records(self.path) if r["step"] < resume_step
              or (r["step"] == resume_step and r.get("split") != "info")]
      with open(self.path + ".tmp", "w") as f:
        f.writelines(kept)
      os.replace(self.path + ".tmp", self.path)
    self._file = open(self.path, "a")
    self._tb = SummaryWriter(os.path.join(workdir, "tb"), purge_step=resume_step + 1
                             if resume_step else None)

  def write(self, step: int, metrics: Mapping[str, float], split: str) -> None:
    """Logs scalar ``metrics`` of ``split`` ("train", "val", "test", "info") at ``step``.

    A NaN or infinite value is written as JSON ``null`` (the file stays strict JSON) and
    as the float itself to TensorBoard.
    """
    if not self.enabled:
      return
    record = {"step": int(step), "split": split, "time": time.time(),
              **{k: float(v) for k, v in metrics.items()}}
    self._file.write(json.dumps(_strict(record), allow_nan=False) + "\n")
    self._file.flush()
    for name, value in metrics.items():
      self._tb.add_scalar(f"{split}/{name}", float(value), int(step))

  def close(self) -> None:
    """Flushes and closes both outputs."""
    if self.enabled:
      self._file.close()
      self._tb.close()
