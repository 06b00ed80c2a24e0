"""Metrics to a JSONL file (one record per line, easy to plot) and to TensorBoard."""

from __future__ import annotations

import json
import os
import time
from typing import Mapping

from tensorboardX import SummaryWriter


class MetricLogger:
  """Writes ``{"step", "split", "time", **metrics}`` lines to ``workdir/metrics.jsonl``
  and the same scalars to TensorBoard under ``workdir/tb`` as ``split/name``.

  On a resumed run, records with ``step > resume_step`` (written after the
  checkpoint the run resumes from) are dropped from the JSONL file first, so a
  killed-and-resumed run leaves one record per step and split.

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
      with open(self.path) as f:
        kept = [line for line in f if line.strip()
                and json.loads(line).get("step", 0) <= resume_step]
      with open(self.path + ".tmp", "w") as f:
        f.writelines(kept)
      os.replace(self.path + ".tmp", self.path)
    self._file = open(self.path, "a")
    self._tb = SummaryWriter(os.path.join(workdir, "tb"), purge_step=resume_step + 1
                             if resume_step else None)

  def write(self, step: int, metrics: Mapping[str, float], split: str) -> None:
    """Logs scalar ``metrics`` of ``split`` ("train", "val", "test", "info") at ``step``."""
    if not self.enabled:
      return
    record = {"step": int(step), "split": split, "time": time.time(),
              **{k: float(v) for k, v in metrics.items()}}
    self._file.write(json.dumps(record) + "\n")
    self._file.flush()
    for name, value in metrics.items():
      self._tb.add_scalar(f"{split}/{name}", float(value), int(step))

  def close(self) -> None:
    """Flushes and closes both outputs."""
    if self.enabled:
      self._file.close()
      self._tb.close()
