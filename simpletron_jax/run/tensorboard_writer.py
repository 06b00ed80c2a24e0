"""TensorBoard event files without TensorFlow, behind clu's ``MetricWriter`` interface.

The summaries are built by tensorboard's plugins (``scalar_pb``, ``text_pb``, ``hparams_pb``)
and framed (length, masked CRC-32C) by its ``RecordWriter``. Its ``EventFileWriter`` is not
used (it imports TensorFlow where installed, and writes from a thread): each call here writes
in the calling thread, so a failed write raises :class:`errors.WriteError` at once.
"""

from __future__ import annotations

import importlib.util
import io
import itertools
import os
import socket
import sys
import time
import types
from typing import Any, Mapping, Optional

from absl import logging
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.plugins.scalar import summary_v2 as scalar_summary
from tensorboard.plugins.text import summary_v2 as text_summary
from tensorboard.summary.writer.record_writer import RecordWriter

from simpletron_jax.runtime import atomic_io

_CLU_INTERFACE = "clu.metric_writers.interface"


def clu_interface() -> types.ModuleType:
  """``clu.metric_writers.interface`` (``MetricWriter``) without TensorFlow: clu 0.0.12's
  ``clu/metric_writers/__init__.py`` imports its TensorFlow ``SummaryWriter``, so this runs
  ``interface.py`` alone, registered under its own name (a later ``import clu.metric_writers``
  reuses it: one ``MetricWriter`` class); a module already imported is returned as is.

  Raises:
    ImportError: clu is not installed, or its layout lacks ``metric_writers/interface.py``.
  """
  if _CLU_INTERFACE in sys.modules:
    return sys.modules[_CLU_INTERFACE]
  if "clu.metric_writers" in sys.modules:
    return importlib.import_module(_CLU_INTERFACE)
  clu_spec = importlib.util.find_spec("clu")
  if clu_spec is None or not clu_spec.submodule_search_locations:
    raise ImportError("clu is not installed: pip install -e . installs it")
  path = os.path.join(list(clu_spec.submodule_search_locations)[0], "metric_writers",
                      "interface.py")
  if not os.path.exists(path):
    raise ImportError(f"this clu has no {path}: simpletron_jax needs clu 0.0.12's layout")
  spec = importlib.util.spec_from_file_location(_CLU_INTERFACE, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[_CLU_INTERFACE] = module
  try:
    spec.loader.exec_module(module)
  except BaseException:
    del sys.modules[_CLU_INTERFACE]
    raise
  return module


MetricWriter = clu_interface().MetricWriter


class ScalarWriter(MetricWriter):
  """A ``MetricWriter`` of scalars and hparams; tensor summaries, images, videos, audio and
  histograms are skipped with one warning per kind and writer."""

  def _skip(self, kind: str) -> None:
    """Warns, once per kind and writer, that ``kind`` is not written."""
    warned = self.__dict__.setdefault("_skipped_kinds", set())
    if kind not in warned:
      warned.add(kind)
      logging.warning("%s does not write %s; skipped", type(self).__name__, kind)

  def write_summaries(self, step: int, values: Mapping[str, Any],
                      metadata: Optional[Mapping[str, Any]] = None) -> None:
    """Not written (skipped with a warning)."""
    del step, values, metadata
    self._skip("tensor summaries")

  def write_images(self, step: int, images: Mapping[str, Any]) -> None:
    """Not written (skipped with a warning)."""
    del step, images
    self._skip("images")

  def write_videos(self, step: int, videos: Mapping[str, Any]) -> None:
    """Not written (skipped with a warning)."""
    del step, videos
    self._skip("videos")

  def write_audios(self, step: int, audios: Mapping[str, Any], *, sample_rate: int) -> None:
    """Not written (skipped with a warning)."""
    del step, audios, sample_rate
    self._skip("audio")

  def write_histograms(self, step: int, arrays: Mapping[str, Any],
                       num_buckets: Optional[Mapping[str, int]] = None) -> None:
    """Not written (skipped with a warning)."""
    del step, arrays, num_buckets
    self._skip("histograms")


_file_counter = itertools.count()
_WHAT = "the TensorBoard events file"   # named in a failed write's message


class TensorBoardWriter(ScalarWriter):
  """Writes one new TensorBoard event file in ``logdir``; synchronous, not thread-safe.

  The file ``path``, ``events.out.tfevents.<10-digit time>.<host>.<pid>.<n>.v2`` (the name
  ``tf.summary`` gives; TensorBoard orders files by name), starts with the ``file_version``
  event and, given ``start_step``, TensorBoard's restart marker: ``SessionLog.START`` at
  ``start_step``, after which TensorBoard drops the events it read at that step or later
  (``plugin_event_accumulator``). A failed write cuts the file back to its previous end.

  Args:
    logdir: the folder (created if missing).
    start_step: the step of the restart marker; None: no marker.

  Raises:
    errors.WriteError: naming the folder or file that could not be created or written; here
      and in every ``write_*`` and :meth:`close`.
  """

  def __init__(self, logdir: str, *, start_step: int | None = None):
    self._file, self._size = None, 0
    try:
      os.makedirs(logdir, exist_ok=True)
    except OSError as e:
      raise atomic_io.write_error(logdir, e) from e
    base = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
    while True:
      self.path = os.path.join(logdir, f"{base}.{next(_file_counter)}.v2")
      try:
        self._file = open(self.path, "xb", buffering=0)  # pylint: disable=consider-using-with
        break
      except FileExistsError:
        continue
      except OSError as e:
        raise atomic_io.write_error(self.path, e, what=_WHAT) from e
    events = [event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")]
    if start_step is not None:
      events.append(event_pb2.Event(
          wall_time=time.time(), step=int(start_step),
          session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))
    try:
      self._write(events, "nothing was written")
    except BaseException:
      self._close_quietly()
      raise

  def _write(self, events: list, kept: str) -> None:
    """Appends ``events`` (``Event`` protos), framed by ``RecordWriter``, and hands them to the OS.

    Raises:
      errors.WriteError: ending with ``kept``; the file is cut back to its previous end.
    """
    if self._file is None:
      raise ValueError(f"{self.path}: the TensorBoard writer is closed")
    framed = io.BytesIO()
    for event in events:
      RecordWriter(framed).write(event.SerializeToString())
    blob = framed.getvalue()
    atomic_io.append_whole(self._file, blob, self._size, self.path, kept, what=_WHAT)
    self._size += len(blob)

  def _summary_event(self, step: int, summary: Any):
    """An ``Event`` at ``step`` (now) holding ``summary`` (a ``Summary`` proto)."""
    return event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary)

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Writes ``scalars`` (tag -> number) at ``step``: float32 ``scalar_pb`` summaries, one event.

    Raises:
      errors.WriteError: the write failed; the events before these are kept.
      TypeError, ValueError: a value is not a number.
    """
    self._write_summaries(step, [scalar_summary.scalar_pb(tag, value)
                                 for tag, value in scalars.items()])

  def _write_summaries(self, step: int, summaries: list) -> None:
    """Writes the values of ``summaries`` (``Summary`` protos) at ``step`` in one event."""
    if not summaries:
      return
    summary = summary_pb2.Summary()
    for one in summaries:
      summary.value.extend(one.value)
    self._write([self._summary_event(step, summary)], "the events before these are kept")

  def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
    """Writes ``texts`` (tag -> string) at ``step``: ``text_pb`` summaries, in one event.

    Raises:
      errors.WriteError: the write failed; the events before these are kept.
    """
    self._write_summaries(step, [text_summary.text_pb(tag, str(text))
                                 for tag, text in texts.items()])

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    """Writes ``hparams`` (flat; bool, int, float or str values: ``metric_logging.flat_config``)
    as the HParams plugin's session start (``hparams_pb``) at step 0.

    Raises:
      errors.WriteError: the write failed; the events before these are kept.
      TypeError: a value of another type.
    """
    summary = hparams_summary.hparams_pb(dict(hparams))
    self._write([self._summary_event(0, summary)], "the events before these are kept")

  def flush(self) -> None:
    """Nothing to do: every ``write_*`` call has handed its events to the OS already."""

  def close(self) -> None:
    """Closes the file; later calls do nothing.

    Raises:
      errors.WriteError: closing failed (the file is closed anyway).
    """
    file, self._file = self._file, None
    if file is None:
      return
    try:
      file.close()
    except OSError as e:
      raise atomic_io.write_error(self.path, e, "the events before are kept",
                                      what=_WHAT) from e

  def _close_quietly(self) -> None:
    """Closes the file, ignoring errors: after a failure."""
    file, self._file = self._file, None
    if file is not None:
      try:
        file.close()
      except OSError:
        pass
