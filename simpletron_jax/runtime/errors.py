"""The named causes a run stops for, and the warning for what it repaired.

:class:`RunError` and its subclasses are the errors a user can act on: ``train.py`` and
``eval.py`` print their one-line message and exit with status 1, without a traceback
(:func:`simpletron_jax.runtime.cli.user_error_message`); a preemption exits 75
(:class:`simpletron_jax.run.preemption.PreemptedError`). :func:`warn` reports what start-up
repaired or ignored (a stale lock, a damaged checkpoint) as a :class:`RunWarning`.

No JAX here: the command-line front ends import this module before JAX starts.
"""

from __future__ import annotations

import warnings


class RunError(RuntimeError):
  """A run stopped for a cause its message names; ``train.py`` exits 1 with the message."""


class NonFiniteError(RunError):
  """A loss, gradient norm or parameter became NaN or infinite."""


class CheckpointError(RunError):
  """A checkpoint could not be saved, or no intact checkpoint could be restored."""


class ConfigMismatchError(RunError):
  """The config differs from the one a checkpoint was saved with."""


class WorkdirLockedError(RunError):
  """Another run holds the workdir's lock file."""


class WriteError(RunError):
  """A file of the run could not be written (a full disk, a read-only folder); the message
  names the file and the OS error."""


class StartError(RunError):
  """The run could not start a service it was asked for (W&B's run: not installed, not logged
  in, no network); no step was trained in this start. ``train.py`` removes the workdir when
  this start created it, so a failed start leaves no partial run folder."""


class Terminated(KeyboardInterrupt):
  """SIGTERM, raised as an exception in the main thread (:func:`simpletron_jax.runtime.cli.
  sigterm_raises`) where the run's preemption guard is not installed: while the data are
  generated or loaded, and during the final test. As a ``KeyboardInterrupt`` it passes every
  ``except Exception``, so each ``finally`` and ``with`` on the way runs: generator workers are
  shut down, half-written files removed, the workdir lock released."""


class RunWarning(UserWarning):
  """Something was repaired or ignored at start-up (a stale lock, a bad checkpoint)."""


def warn(message: str) -> None:
  """Emits ``message`` as a :class:`RunWarning` (shown on stderr by default)."""
  warnings.warn(message, RunWarning, stacklevel=2)
