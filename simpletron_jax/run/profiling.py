"""A JAX profiler trace of chosen optimizer steps: ``train.py --profile_steps=A:B``.

:func:`parse_profile_steps` reads the flag; :class:`StepProfiler` starts
``jax.profiler.start_trace`` before step A's first micro-step and stops it after step B, once
B's outputs are computed (``jax.block_until_ready``), so the trace holds the device work of
steps A..B and not only their dispatch. Each traced step is marked with
``jax.profiler.StepTraceAnnotation("train", step_num=step)``, which the profile viewer uses
as step boundaries. The trace goes to ``<logdir>/plugins/profile/<time>/``:
``<host>.xplane.pb`` for TensorBoard's profile plugin (XProf) and ``perfetto_trace.json.gz``
for https://ui.perfetto.dev.

This module imports JAX only when a trace starts, so ``train.py`` checks the flag before JAX
starts.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

FLAG = "--profile_steps"


def check_profile_steps(steps: tuple[int, int] | None, num_train_steps: int
                        ) -> tuple[int, int] | None:
  """Checks a ``(first, last)`` pair of optimizer steps to trace (both included).

  Args:
    steps: ``(A, B)``, or None for no trace.
    num_train_steps: the run's last step (``config.num_train_steps``).

  Returns:
    ``(A, B)`` as ints, or None.

  Raises:
    ValueError: naming ``--profile_steps``, unless ``1 <= A <= B <= num_train_steps``.
  """
  if steps is None:
    return None
  try:
    first, last = (int(s) for s in steps)
  except (TypeError, ValueError):
    raise ValueError(f"{FLAG}={steps!r}: expected two optimizer steps A:B") from None
  if first < 1 or last < first or last > num_train_steps:
    raise ValueError(f"{FLAG}={first}:{last}: need 1 <= A <= B <= num_train_steps="
                     f"{num_train_steps} (A and B are optimizer steps, both traced)")
  return first, last


def parse_profile_steps(text: str | None, num_train_steps: int) -> tuple[int, int] | None:
  """Reads ``--profile_steps``: ``"A:B"``, two optimizer steps (both traced).

  Args:
    text: the flag's value; None or "" for no trace.
    num_train_steps: the run's last step (``config.num_train_steps``).

  Returns:
    ``(A, B)``, or None.

  Raises:
    ValueError: naming ``--profile_steps``, when ``text`` is not ``A:B`` with integers
      ``1 <= A <= B <= num_train_steps``.
  """
  if not text:
    return None
  parts = text.split(":")
  try:
    if len(parts) != 2:
      raise ValueError
    steps = int(parts[0]), int(parts[1])
  except ValueError:
    raise ValueError(f"{FLAG}={text!r} is not A:B, two optimizer steps such as "
                     "--profile_steps=10:12") from None
  return check_profile_steps(steps, num_train_steps)


def check_profiler_can_run() -> None:
  """Refuses the case where JAX's profiler crashes the process instead of tracing.

  With libtpu installed (the ``test`` and ``tpu`` extras) on a machine without a TPU, JAX
  still loads libtpu's PJRT plugin unless ``JAX_PLATFORMS`` leaves TPUs out, and with
  libtpu 0.0.52 and jax 0.10.2 ``jax.profiler.start_trace`` then ends the process with a
  segmentation fault ("Unexpected PLUGIN_Profiler_Api size").

  Raises:
    ValueError: naming ``--profile_steps`` and the fix (``JAX_PLATFORMS=cpu`` or ``cuda``).
  """
  import jax  # pylint: disable=import-outside-toplevel
  platforms = [p for p in (jax.config.jax_platforms or "").split(",") if p]
  if (importlib.util.find_spec("libtpu") is not None and jax.default_backend() != "tpu"
      and (not platforms or "tpu" in platforms)):
    raise ValueError(f"{FLAG}: libtpu is installed on a machine whose JAX backend is "
                     f"{jax.default_backend()}, and JAX's profiler crashes with libtpu's "
                     "plugin loaded; set JAX_PLATFORMS to this machine's platform (e.g. "
                     "JAX_PLATFORMS=cpu or JAX_PLATFORMS=cuda) and rerun")


class StepProfiler:
  """Traces optimizer steps ``first..last`` of a run into ``logdir``.

  Call :meth:`step_started` before a step's first micro-step and :meth:`step_finished`
  after its last; :meth:`close` (in a ``finally``) stops a trace that a failure or a
  preemption left running, keeping what it holds.

  Args:
    logdir: the trace folder (``workdir/profile``); created when the trace starts.
    steps: ``(first, last)`` from :func:`check_profile_steps`, or None: nothing is traced.
    start_step: the step the run resumes from (0 for a new run). A run resumed at or past
      ``first`` (``start_step >= first``) traces nothing: the trace would miss steps.
    enabled: False on the other hosts of a multi-host run (process 0 traces).

  Attributes:
    trace_dir: after the trace stopped, its folder ``logdir/plugins/profile/<time>``.

  Raises:
    ValueError: see :func:`check_profiler_can_run` (only when a trace will be taken).
  """

  def __init__(self, logdir: str, steps: tuple[int, int] | None, start_step: int,
               enabled: bool = True):
    self.logdir = logdir
    self.steps = steps if enabled and steps and start_step < steps[0] else None
    if steps and enabled and self.steps is None:
      print(f"{FLAG}={steps[0]}:{steps[1]}: not traced, the run resumes at step "
            f"{start_step + 1}", file=sys.stderr)
    self.active = False
    self.trace_dir = None
    self._annotation = None
    self._last_traced = None
    if self.steps is not None:
      check_profiler_can_run()

  def step_started(self, step: int) -> None:
    """Starts the trace at step ``first``; marks each traced step's start."""
    if self.steps is None:
      return
    import jax  # pylint: disable=import-outside-toplevel
    if step == self.steps[0] and not self.active:
      os.makedirs(self.logdir, exist_ok=True)
      jax.profiler.start_trace(self.logdir, create_perfetto_trace=True)
      self.active = True
    if self.active:
      self._last_traced = step
      self._annotation = jax.profiler.StepTraceAnnotation("train", step_num=step)
      self._annotation.__enter__()

  def step_finished(self, step: int, outputs: Any) -> None:
    """Ends a traced step's mark; after step ``last``, waits for ``outputs`` (the step's
    results, e.g. the train state) to be computed, then stops the trace."""
    if not self.active:
      return
    if step >= self.steps[1]:
      import jax  # pylint: disable=import-outside-toplevel
      jax.block_until_ready(outputs)
      self._end_annotation()
      self._stop()
    else:
      self._end_annotation()

  def close(self) -> None:
    """Stops a running trace (a run that stopped inside ``first..last``: the trace keeps
    the steps it reached); else nothing. Meant for a ``finally``: a failure to stop is a
    :class:`simpletron_jax.runtime.errors.RunWarning`, so it cannot hide the error being raised."""
    if not self.active:
      return
    try:
      self._end_annotation()
      self._stop()
    except Exception as e:  # pylint: disable=broad-except
      from simpletron_jax.runtime import errors  # pylint: disable=import-outside-toplevel
      errors.warn(f"{FLAG}: the profiler trace in {self.logdir} could not be stopped: {e}")

  def _end_annotation(self) -> None:
    """Closes the open step mark, if any."""
    annotation, self._annotation = self._annotation, None
    if annotation is not None:
      annotation.__exit__(None, None, None)

  def _stop(self) -> None:
    """Stops the trace, which JAX writes now, and reports its folder on stderr."""
    import jax  # pylint: disable=import-outside-toplevel
    self.active = False
    jax.profiler.stop_trace()
    runs = os.path.join(self.logdir, "plugins", "profile")
    found = sorted(os.listdir(runs)) if os.path.isdir(runs) else []
    self.trace_dir = os.path.join(runs, found[-1]) if found else self.logdir
    print(f"profile of steps {self.steps[0]}..{self._last_traced} written to {self.trace_dir} "
          "(docs/runs.md, \"Profiling\")", file=sys.stderr)
