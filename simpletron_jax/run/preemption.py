"""SIGTERM or SIGINT saves the current step and exits 75 (docs/faults.md).

:class:`PreemptionGuard` turns the signal into a stop after the current step, agreed on by
every host; ``trainer.train_and_evaluate`` then saves and raises :class:`PreemptedError`.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import jax
import numpy as np

from simpletron_jax.runtime.errors import RunError


PREEMPTED_EXIT_CODE = 75
"""``train.py``'s exit status after a preemption (:class:`PreemptedError`): ``EX_TEMPFAIL`` of
``sysexits.h``, "a temporary failure ... the user is invited to retry". Every other
:class:`RunError` exits 1."""


class PreemptedError(RunError):
  """The run stopped on a signal after saving ``step``; rerunning the command continues it.

  Attributes:
    step: the optimizer step saved.
    cause: ``"SIGTERM"``, ``"SIGINT"`` or ``"a preemption notice"``.
  """

  def __init__(self, step: int, cause: str):
    super().__init__(f"preempted at step {step}; rerun the same command to continue")
    self.step, self.cause = int(step), cause


class PreemptionGuard:
  """Turns SIGTERM and SIGINT (Ctrl-C) into a stop after the current step, on every host.

  Call :meth:`should_stop` after every step, on every host. The modes (:meth:`install`):

  * ``local`` (one process): Python handlers set a flag.
  * ``jax`` (several processes, ``jax_enable_preemption_service``): JAX's own SIGTERM handler
    stays, SIGINT is forwarded to it, and :meth:`should_stop` is
    ``multihost_utils.reached_preemption_sync_point`` (one step for all hosts, no collective).
  * ``any_host`` (several processes, no service): Python handlers; one allgather per step.

  A second signal restores the previous handlers and passes the signal on. Handlers are
  installed from the main thread only; leaving the ``with`` block restores the previous ones.

  Attributes:
    signal_name: the first signal received, or None.
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.signal_name: str | None = None
    self.mode = "off"
    self._previous: dict[int, Any] = {}

  def __enter__(self) -> "PreemptionGuard":
    return self.install()

  def __exit__(self, *exc_info) -> None:
    self.restore()

  def install(self) -> "PreemptionGuard":
    """Installs the handlers (as entering ``with`` does); every host picks the same mode."""
    handled = self.SIGNALS
    if jax.process_count() == 1:
      self.mode = "local"
    elif getattr(jax.config, "jax_enable_preemption_service", False):
      self.mode, handled = "jax", (signal.SIGINT,)
    else:
      self.mode = "any_host"
    if self._previous or threading.current_thread() is not threading.main_thread():
      return self
    for signum in handled:
      self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def restore(self) -> None:
    """Puts back the handlers found on entry (idempotent)."""
    previous, self._previous = self._previous, {}
    for signum, handler in previous.items():
      signal.signal(signum, signal.SIG_DFL if handler is None else handler)

  def _handle(self, signum: int, frame) -> None:
    name = signal.Signals(signum).name
    if self.signal_name is not None:
      handler = self._previous.get(signum)
      self.restore()
      os.write(2, f"\n{name} again: stopping at once, without saving\n".encode())
      if callable(handler):
        handler(signum, frame)
      elif handler in (None, signal.SIG_DFL):
        signal.raise_signal(signum)
      return
    self.signal_name = name
    os.write(2, f"\n{name} received: stopping after the current step and saving a checkpoint "
                f"(send it again to stop at once, without saving)\n".encode())
    if self.mode == "jax":
      os.kill(os.getpid(), signal.SIGTERM)   # to JAX's preemption notifier

  def should_stop(self, step: int) -> bool:
    """Whether to save and stop after optimizer ``step``; the same answer on every host (a
    collective on several hosts: each calls it after every step)."""
    if self.mode == "jax":
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      return bool(multihost_utils.reached_preemption_sync_point(int(step)))
    if self.mode == "any_host":
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      flags = multihost_utils.process_allgather(np.int32(self.signal_name is not None))
      return bool(np.any(np.asarray(flags)))
    return self.signal_name is not None

  def requested_locally(self) -> bool:
    """A signal arrived on this single-process run; always False on several hosts."""
    return self.mode == "local" and self.signal_name is not None

  @property
  def cause(self) -> str:
    """The signal's name, or ``"a preemption notice"`` (SIGTERM through JAX's service)."""
    return self.signal_name or "a preemption notice"
