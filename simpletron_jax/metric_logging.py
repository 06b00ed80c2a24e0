"""Metrics to a JSONL file (one record per line, easy to plot) and to TensorBoard.

Both files are written in the caller's thread and flushed after every record, so a failed
write (a full disk, a read-only folder) stops the run at once with a
:class:`simpletron_jax.errors.WriteError` naming the file. tensorboardX's ``SummaryWriter``
writes from a thread instead: when a full disk killed that thread, ``add_scalar`` blocked
forever on the thread's 10-event queue and the run hung (issue 27); and its events waited up to
two minutes in a buffer, so a run that failed lost them.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
import uuid
import warnings
from typing import Any, Mapping

from tensorboardX.proto.event_pb2 import Event, SessionLog
from tensorboardX.record_writer import RecordWriter
from tensorboardX.summary import scalar

from simpletron_jax import atomic_io


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
  writes it again) are dropped from the JSONL file first (written aside, then renamed over
  it), so a killed-and-resumed run leaves one record per step and split.

  Each start writes a new TensorBoard event file,
  ``tb/events.out.tfevents.<time>.<host>.<pid>.<random>``; a resumed run's file starts with
  TensorBoard's purge marker (a ``SessionLog.START`` event at ``resume_step + 1``, as
  ``SummaryWriter(purge_step=...)`` writes), which hides the killed run's events after its
  checkpoint.

  Args:
    workdir: run directory; must exist.
    resume_step: the optimizer step the run restarts from (0 for a new run).
    enabled: False on non-zero hosts of a multi-host run; then nothing is
      written.

  Raises:
    ValueError: ``metrics.jsonl`` holds a damaged record (see :func:`read_records`).
    errors.WriteError: a file could not be written; here and in :meth:`write` and
      :meth:`close`, naming it.
  """

  def __init__(self, workdir: str, resume_step: int = 0, enabled: bool = True):
    self.enabled = enabled
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.tb_path = None
    self._file = self._tb = None
    if not enabled:
      return
    if os.path.exists(self.path):
      kept = [json.dumps(_strict(r), allow_nan=False) + "\n"
              for r in read_records(self.path) if r["step"] < resume_step
              or (r["step"] == resume_step and r.get("split") != "info")]
      atomic_io.write_text_atomic(self.path, "".join(kept))
    tb_dir = os.path.join(workdir, "tb")
    self.tb_path = os.path.join(tb_dir, f"events.out.tfevents.{int(time.time())}."
                                f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    current = self.path
    try:
      self._file = open(self.path, "a", encoding="utf-8")
      current = self.tb_path
      os.makedirs(tb_dir, exist_ok=True)
      self._tb = RecordWriter(self.tb_path)
      self._write_events([Event(wall_time=time.time(), file_version="brain.Event:2")])
      if resume_step:
        self._write_events([Event(wall_time=time.time(), step=resume_step + 1,
                                  session_log=SessionLog(status=SessionLog.START))])
    except OSError as e:
      self._close_quietly()
      raise atomic_io.write_error(current, e) from e

  def _write_events(self, events) -> None:
    """Appends TensorBoard events and flushes them (OSError on failure)."""
    for event in events:
      self._tb.write(event.SerializeToString())
    self._tb.flush()

  def write(self, step: int, metrics: Mapping[str, float], split: str) -> None:
    """Logs scalar ``metrics`` of ``split`` ("train", "val", "test", "info") at ``step``.

    A NaN or infinite value is written as JSON ``null`` (the file stays strict JSON) and
    as the float itself to TensorBoard.
    """
    if not self.enabled:
      return
    now = time.time()
    record = {"step": int(step), "split": split, "time": now,
              **{k: float(v) for k, v in metrics.items()}}
    try:
      self._file.write(json.dumps(_strict(record), allow_nan=False) + "\n")
      self._file.flush()
    except OSError as e:
      raise atomic_io.write_error(self.path, e, "the records before this one are kept") from e
    try:
      self._write_events([Event(wall_time=now, step=int(step),
                                summary=scalar(f"{split}/{name}", float(value)))
                          for name, value in metrics.items()])
    except OSError as e:
      raise atomic_io.write_error(self.tb_path, e, "the events before these are kept") from e

  def close(self) -> None:
    """Flushes and closes both outputs; later calls do nothing.

    Raises:
      errors.WriteError: a final flush failed (both files are closed anyway).
    """
    file, tb, self._file, self._tb = self._file, self._tb, None, None
    for path, handle in ((self.path, file), (self.tb_path, tb)):
      if handle is not None:
        try:
          handle.close()
        except OSError as e:
          self._close_quietly(file, tb)
          raise atomic_io.write_error(path, e) from e

  def _close_quietly(self, *handles) -> None:
    """Closes the given handles (default: this logger's), ignoring errors: after a failure."""
    for handle in handles or (self._file, self._tb):
      try:
        if handle is not None:
          handle.close()
      except OSError:
        pass
    if not handles:
      self._file = self._tb = None
