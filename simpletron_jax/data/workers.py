"""Worker processes for the dataset generators (ListOps, Pathfinder).

The generators run their blocks in ``spawn`` processes, not forked ones: the caller may
already run JAX threads, and a forked copy of those can deadlock. A spawned worker imports
the caller's main module again. When that module cannot be imported (a script read from
stdin, ``python - <<EOF``), every worker dies at start. ``multiprocessing.Pool`` restarts
dead workers without end, so the caller hangs while the log fills with the same traceback. A :class:`concurrent.futures.ProcessPoolExecutor` marks
itself broken instead, and :func:`results` turns that into an error that says what to do.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import multiprocessing
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Iterable, Iterator, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_BROKEN = ("a {what} worker process died ({error}). Workers are spawned and import the "
           "main module again: a script read from stdin ('python -') cannot be, so run it "
           "from a file or with 'python -c', or pass num_workers=1 to generate in this process")


@contextlib.contextmanager
def executor(workers: int, tasks: int) -> Iterator[concurrent.futures.Executor | None]:
  """A spawn process pool of ``min(workers, tasks)`` processes, or None for 1 or fewer.

  The pool is shut down on exit, with the tasks not yet started cancelled.
  """
  count = min(int(workers), int(tasks))
  if count <= 1:
    yield None
    return
  pool = concurrent.futures.ProcessPoolExecutor(
      count, mp_context=multiprocessing.get_context("spawn"))
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
    yield from map(fn, tasks)
    return
  # Each future leaves `pending` once its result is yielded, so the generators stream.
  pending = collections.deque(pool.submit(fn, task) for task in tasks)
  try:
    if ordered:
      while pending:
        yield pending.popleft().result()
    else:
      for future in concurrent.futures.as_completed(list(pending)):
        pending.remove(future)
        yield future.result()
  except BrokenProcessPool as error:
    raise RuntimeError(_BROKEN.format(what=what, error=error)) from error
  finally:
    for future in pending:
      future.cancel()
