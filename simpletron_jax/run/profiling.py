"""A JAX profiler trace of steps A..B, ``train.py --profile_steps=A:B`` (docs/runs.md): JAX
writes ``<logdir>/plugins/profile/<time>/{<host>.xplane.pb,perfetto_trace.json.gz}``. JAX is
imported only when a trace starts."""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

FLAG = "--profile_steps"


def check_profile_steps(steps: tuple[int, int] | None, num_train_steps: int
                        ) -> tuple[int, int] | None:
  """``steps`` (``(A, B)`` optimizer steps, both traced; None: no trace) as ints.

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
  """Reads ``text``, ``--profile_steps``'s ``"A:B"`` (None or "": no trace): ``(A, B)`` or None.

  Raises:
    ValueError: naming ``--profile_steps``, unless ``A:B`` with 1 <= A <= B <= num_train_steps.
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
  """Refuses libtpu without a TPU (when ``JAX_PLATFORMS`` does not leave TPUs out), where
  ``jax.profiler.start_trace`` segfaults ("Unexpected PLUGIN_Profiler_Api size"; libtpu 0.0.52,
  jax 0.10.2).

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
  """Traces optimizer steps ``first..last`` into ``logdir``, each marked with
  ``jax.profiler.StepTraceAnnotation("train", step_num=step)``.

  Args:
    logdir: the trace folder (``workdir/profile``), created when the trace starts.
    steps: ``(first, last)`` from :func:`check_profile_steps`; None: no trace.
    start_step: the step the run resumes from; at or past ``first``: no trace.
    enabled: False on hosts other than process 0.

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
    """Call before a step's first micro-step: starts the trace at ``first``, marks the step."""
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
    """Call after a step's last micro-step; after ``last``, waits for ``outputs`` (e.g. the
    train state) to be computed (``jax.block_until_ready``), then stops the trace."""
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
    """Stops a trace left running (by a failure, a preemption), keeping its steps; for a
    ``finally``: a failure to stop only warns (:class:`errors.RunWarning`)."""
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
    """Stops the trace (JAX writes it now); sets ``trace_dir`` and reports it on stderr."""
    import jax  # pylint: disable=import-outside-toplevel
    self.active = False
    jax.profiler.stop_trace()
    runs = os.path.join(self.logdir, "plugins", "profile")
    found = sorted(os.listdir(runs)) if os.path.isdir(runs) else []
    self.trace_dir = os.path.join(runs, found[-1]) if found else self.logdir
    print(f"profile of steps {self.steps[0]}..{self._last_traced} written to {self.trace_dir} "
          "(docs/runs.md, \"Profiling\")", file=sys.stderr)
