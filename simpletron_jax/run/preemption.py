"""Preemption-safe training: SIGTERM or SIGINT saves the step and exits 75.

A preemptible VM or a cluster scheduler sends SIGTERM shortly before it stops a job.
:class:`PreemptionGuard` turns that signal (and Ctrl-C) into a request to stop after the
current step, agreed on by every host; ``trainer.train_and_evaluate`` then saves that
step, releases the workdir lock and raises :class:`PreemptedError`, and ``train.py`` exits
with :data:`PREEMPTED_EXIT_CODE`, so that a scheduler reruns the same command, which resumes.
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
  """The run stopped on SIGTERM or SIGINT after saving a checkpoint of ``step``; rerunning
  the same command continues it. ``train.py`` exits with :data:`PREEMPTED_EXIT_CODE`.

  Attributes:
    step: the optimizer step saved.
    cause: what stopped it (``"SIGTERM"``, ``"SIGINT"``, ``"a preemption notice"``).
  """

  def __init__(self, step: int, cause: str):
    super().__init__(f"preempted at step {step}; rerun the same command to continue")
    self.step, self.cause = int(step), cause


class PreemptionGuard:
  """Turns SIGTERM (what a preemptible VM or a cluster scheduler sends) and SIGINT (Ctrl-C)
  into a request to stop after the current training step.

  Enter it around a training loop and call :meth:`should_stop` once after every step, on
  every host, with that step; when it returns True, save and stop. How the hosts agree:

  * one process (``jax.process_count() == 1``): Python handlers for both signals set a
    flag, which :meth:`should_stop` returns;
  * several processes with JAX's preemption service (``jax.distributed`` with
    ``jax_enable_preemption_service``, the default): ``jax.distributed.initialize``
    installed the service's own SIGTERM handler, which tells every host; it is left in place,
    and SIGINT is forwarded to it as a SIGTERM. :meth:`should_stop` is
    ``multihost_utils.reached_preemption_sync_point(step)``: True on every host at the same
    step, one past the largest step any host had reached when the notice spread; no
    collective per step;
  * several processes without that service: Python handlers, and :meth:`should_stop` ORs
    the flags of all hosts (one small collective per step).

  A second signal while a stop is pending restores the previous handlers and passes the
  signal on (a second Ctrl-C raises ``KeyboardInterrupt``; a second SIGTERM with the default
  handler ends the process). Python installs handlers only from the main thread; in other
  threads none is installed (the hosts still agree). Leaving the ``with`` block (or
  :meth:`restore`) puts the previous handlers back.

  Attributes:
    signal_name: the first signal received through this guard's handlers, or None.
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
    """Installs the handlers (what entering the ``with`` block does); returns the guard.

    The mode depends only on the host count and JAX's config, so every host picks the same.
    """
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
    if self.signal_name is not None:   # the second one: stop at once
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
    """Whether to save and stop after optimizer ``step``; the same answer on every host.

    A collective call on several hosts: every host calls it after every step.
    """
    if self.mode == "jax":
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      return bool(multihost_utils.reached_preemption_sync_point(int(step)))
    if self.mode == "any_host":
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      flags = multihost_utils.process_allgather(np.int32(self.signal_name is not None))
      return bool(np.any(np.asarray(flags)))
    return self.signal_name is not None

  def requested_locally(self) -> bool:
    """A signal arrived on this single-process run (after its last :meth:`should_stop`, for
    example); always False on several hosts, which must agree through :meth:`should_stop`."""
    return self.mode == "local" and self.signal_name is not None

  @property
  def cause(self) -> str:
    """The signal's name, or ``"a preemption notice"`` (SIGTERM through JAX's service)."""
    return self.signal_name or "a preemption notice"
