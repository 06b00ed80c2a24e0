"""Worker processes for the dataset generators (ListOps, Pathfinder).

The generators run their blocks in ``spawn`` processes, not forked ones: the caller may
already run JAX threads, and a forked copy of those can deadlock. A spawned worker imports
the caller's main module again. When that module cannot be imported (a script read from
stdin, ``python - <<EOF``), every worker dies at start. ``multiprocessing.Pool`` restarts
dead workers without end, so the caller hangs while the log fills with the same traceback. A :class:`concurrent.futures.ProcessPoolExecutor` marks
itself broken instead, and :func:`results` turns that into an error that says what to do.

The workers leave signals to the caller: they ignore SIGINT and SIGTERM (a Ctrl-C or a
scheduler's signal to the whole process group reaches the caller, which stops them through
the pool's shutdown, its output files removed), and each exits by itself within a second
when the caller is gone without shutting them down (killed by SIGKILL), so no idle worker,
and no multiprocessing resource tracker waiting on them, outlives the caller.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Iterable, Iterator, Sequence, TypeVar

from simpletron_jax.runtime import cli

T = TypeVar("T")
R = TypeVar("R")

_BROKEN = ("a {what} worker process died ({error}). Workers are spawned and import the "
           "main module again: a script read from stdin ('python -') cannot be, so run it "
           "from a file or with 'python -c', or pass num_workers=1 to generate in this process")


_POLL_S = 0.5   # seconds between results' checks for a lost SIGTERM while it waits

PARENT_POLL_S = 1.0
"""Seconds between a worker's checks that the process that started it is still there."""


def _exit_with_parent(parent_pid: int) -> None:
  """Ends this worker process once its parent is gone (it is then re-parented)."""
  while True:
    time.sleep(PARENT_POLL_S)
    if os.getppid() != parent_pid:
      os._exit(1)   # pylint: disable=protected-access  (no clean-up left to do for a worker)


def _init_worker(parent_pid: int) -> None:
  """Each worker's start: signals are the caller's to act on, and the worker ends with it
  (see the module docstring)."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True,
                   name="exit-with-parent").start()


@contextlib.contextmanager
def executor(workers: int, tasks: int) -> Iterator[concurrent.futures.Executor | None]:
  """A spawn process pool of ``min(workers, tasks)`` processes, or None for 1 or fewer.

  The pool is shut down on exit, also on an exception (a ``KeyboardInterrupt`` from SIGINT,
  or from SIGTERM as ``train.py`` raises it), with the tasks not yet started cancelled and the
  workers joined. The workers ignore SIGINT and SIGTERM and end with their parent.
  """
  count = min(int(workers), int(tasks))
  if count <= 1:
    yield None
    return
  pool = concurrent.futures.ProcessPoolExecutor(
      count, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker,
      initargs=(os.getpid(),))
  try:
    yield pool
  finally:
    pool.shutdown(wait=True, cancel_futures=True)


def results(pool: concurrent.futures.Executor | None, fn: Callable[[T], R],
            tasks: Sequence[T], *, ordered: bool, what: str) -> Iterable[R]:
  """``fn(task)`` for every task: in task order if ``ordered``, else as they finish.

  Args:
    pool: from :func:`executor`; None runs the tasks here, lazily, in order.
    fn: a module-level function (it is pickled to the workers).
    tasks: the arguments, one per call.
    ordered: keep the task order (ListOps' output depends on it), or yield each result as
      soon as it is ready (Pathfinder writes by index).
    what: the generator's name, for the error message.

  Raises:
    RuntimeError: a worker process died (see the module docstring); the message says how to
      run the generator instead.
  """
  if pool is None:
    for task in tasks:
      cli.raise_if_terminated()
      yield fn(task)
    return
  # Each future leaves `pending` once its result is yielded, so the generators stream. The
  # waits are short, so that a SIGTERM whose exception Python dropped still stops the loop
  # (cli.raise_if_terminated).
  pending = collections.deque(pool.submit(fn, task) for task in tasks)
  try:
    while pending:
      cli.raise_if_terminated()
      done, _ = concurrent.futures.wait([pending[0]] if ordered else pending, timeout=_POLL_S,
                                        return_when=concurrent.futures.FIRST_COMPLETED)
      if ordered:
        ready = [pending[0]] if done else []
      else:
        ready = list(done)
      for future in ready:
        pending.remove(future)
        yield future.result()
  except BrokenProcessPool as error:
    raise RuntimeError(_BROKEN.format(what=what, error=error)) from error
  finally:
    for future in pending:
      future.cancel()
