"""Progress bars that suit a terminal and a log file alike.

On a terminal (stderr is a TTY) :func:`bar` is a ``tqdm`` bar, redrawn in place. Without a
terminal (a log file, a pipe, a batch job) ``tqdm``'s ``\\r`` redraws pile up in the file
(docs/faults.md), so :func:`bar` is a :class:`LineProgress` instead: one plain
line every ``interval`` seconds and one at the end, such as
``train: 120/5000 (2%), 3.41 it/s, loss=2.31, acc=0.17``. ``TQDM_DISABLE=1`` (tqdm's own
variable) turns either off, as does ``disable=True``.

No JAX here.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any, TextIO

import tqdm

# Seconds between two lines of a LineProgress (``SIMPLETRON_PROGRESS_SECONDS`` overrides it).
DEFAULT_INTERVAL_S = 30.0


def disabled_by_env() -> bool:
  """True when ``TQDM_DISABLE`` is set to a true value (``1``, ``true``, ``yes``), as tqdm
  reads it."""
  return os.environ.get("TQDM_DISABLE", "").strip().lower() in ("1", "true", "yes", "on")


def env_interval() -> float:
  """Seconds between two progress lines: ``SIMPLETRON_PROGRESS_SECONDS`` when set, else
  :data:`DEFAULT_INTERVAL_S`.

  Raises:
    ValueError: one line naming the variable, when it is not a finite number of seconds >= 0
      (``train.py`` checks it before anything is written).
  """
  text = os.environ.get("SIMPLETRON_PROGRESS_SECONDS")
  if text is None:
    return DEFAULT_INTERVAL_S
  try:
    seconds = float(text)
  except ValueError:
    seconds = math.nan
  if not math.isfinite(seconds) or seconds < 0:
    raise ValueError(f"SIMPLETRON_PROGRESS_SECONDS={text!r} is not a number of seconds >= 0 "
                     f"(the time between two progress lines): set it to, e.g., "
                     f"{DEFAULT_INTERVAL_S:g}, or unset it")
  return seconds


class LineProgress:
  """A ``tqdm``-like counter that prints whole lines: the interface the training loop and the
  data generators use (``update``, ``set_postfix``, ``write``, ``close``; a context manager).

  Args:
    total: the count at 100%, or None.
    desc: the name printed first.
    unit: what is counted (``it``, ``ex``, ``img``).
    initial: the count to start from (a resumed run's step).
    interval: seconds between two lines; :meth:`close` prints the last one.
    disable: print nothing.
    file: where the lines go (default: ``sys.stderr`` at each print).
  """

  def __init__(self, total: int | None = None, desc: str = "", unit: str = "it",
               initial: int = 0, interval: float | None = None, disable: bool = False,
               file: TextIO | None = None):
    self.total, self.desc, self.unit = total, desc, unit
    self.n = self.last_printed = int(initial)
    self.disable = disable
    self.interval = env_interval() if interval is None else float(interval)
    self._file = file
    self._postfix: dict[str, Any] = {}
    self._start = self._last_time = time.time()
    self._initial = int(initial)
    self._closed = False
    self._changed = False   # the count or the postfix moved since the last line

  def __enter__(self) -> "LineProgress":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  def line(self) -> str:
    """The current state as one line: count, percentage, rate since the start, postfix."""
    done = f"{self.n}/{self.total}" if self.total else f"{self.n}"
    if self.total:
      done += f" ({100.0 * self.n / self.total:.0f}%)"
    rate = (self.n - self._initial) / max(time.time() - self._start, 1e-9)
    parts = [f"{self.desc}: {done}" if self.desc else done, f"{rate:.2f} {self.unit}/s"]
    parts += [f"{k}={v}" for k, v in self._postfix.items()]
    return ", ".join(parts)

  def _print(self) -> None:
    print(self.line(), file=self._file or sys.stderr, flush=True)
    self.last_printed, self._last_time, self._changed = self.n, time.time(), False

  def update(self, n: int = 1) -> None:
    """Adds ``n`` to the count; prints a line when ``interval`` seconds have passed since the
    last one (the last line is :meth:`close`'s, with the final postfix)."""
    self.n += int(n)
    self._changed = True
    if not self.disable and time.time() - self._last_time >= self.interval:
      self._print()

  def set_postfix(self, **values: Any) -> None:
    """Values printed after the rate on the next line (``loss="2.31"``)."""
    self._postfix = dict(values)
    self._changed = True

  def write(self, message: str) -> None:
    """Prints ``message`` on its own line to stdout (as ``tqdm.write`` does)."""
    print(message, flush=True)

  def close(self) -> None:
    """Prints a last line if the count or the postfix moved since the previous one
    (idempotent)."""
    if self._closed:
      return
    self._closed = True
    if not self.disable and self._changed:
      self._print()


def bar(total: int | None = None, desc: str = "", unit: str = "it", initial: int = 0,
        disable: bool = False, interval: float | None = None,
        **tqdm_kwargs: Any) -> "tqdm.tqdm | LineProgress":
  """A progress bar for ``total`` units: ``tqdm`` on a terminal, :class:`LineProgress`
  (periodic whole lines) otherwise; off when ``disable`` or ``TQDM_DISABLE`` is set.

  Args:
    total, desc, unit, initial: as for ``tqdm.tqdm``.
    disable: print nothing (e.g. on every process but process 0).
    interval: seconds between lines without a terminal (default
      :data:`DEFAULT_INTERVAL_S`, or ``SIMPLETRON_PROGRESS_SECONDS``).
    **tqdm_kwargs: passed to ``tqdm.tqdm`` on a terminal (``dynamic_ncols``, ``smoothing``).

  Returns:
    An object with ``update``, ``set_postfix``, ``write`` and ``close``, usable in ``with``.
  """
  disable = bool(disable) or disabled_by_env()
  if not disable and sys.stderr.isatty():
    return tqdm.tqdm(total=total, desc=desc, unit=unit, initial=initial, **tqdm_kwargs)
  return LineProgress(total=total, desc=desc, unit=unit, initial=initial, interval=interval,
                      disable=disable)
