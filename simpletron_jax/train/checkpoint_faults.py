"""What can go wrong under the checkpoints, kept to one line: a step orbax cannot list is set
aside, and a failed or abandoned save leaves no half-written step, no orbax thread and no
traceback after the caller's line (docs/faults.md).
"""

from __future__ import annotations

import errno
import glob
import json
import logging
import os
import shutil
import sys
import threading
import time
import traceback

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_manager as ocp_manager

from simpletron_jax.runtime import distributed, errors


# The files of a step that orbax's CheckpointManager parses when it opens a folder (the metrics
# item, read to rank the steps): one that is not JSON (emptied, or NUL bytes left by a crash)
# fails the manager's construction itself, before restore_checkpoint could skip the step.
LISTED_FILES = (os.path.join("metrics", "metrics"),)


def _unlisted_problem(step_folder: str) -> str | None:
  """Why orbax cannot list ``step_folder`` (one of :data:`LISTED_FILES` is unreadable or not
  JSON), or None."""
  for name in LISTED_FILES:
    path = os.path.join(step_folder, name)
    if not os.path.exists(path):
      continue
    try:
      with open(path, "rb") as f:
        json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError) as e:   # UnicodeDecodeError and JSONDecodeError included
      return f"{name}: {type(e).__name__}: {first_line(e)}"
  return None


def set_aside_unlisted_steps(directory: str, damaged_dir: str) -> list[str]:
  """Moves each step folder of ``directory`` that orbax could not list (:data:`LISTED_FILES`)
  into ``damaged_dir``, with one :class:`errors.RunWarning` naming it and why, so that the
  manager opens and the run resumes from the newest intact step (docs/faults.md). Every host
  scans, then process 0 moves and the others wait for it: a collective call on several hosts,
  as orbax's manager is.

  Args:
    directory: a checkpoint folder (``<workdir>/checkpoints``); may not exist yet.
    damaged_dir: where damaged steps go (``<workdir>/damaged``), as ``<folder>_<step>_<time>``.

  Returns:
    The new paths of the moved steps.
  """
  found = []
  for name in (sorted(os.listdir(directory), key=lambda n: (len(n), n))
               if os.path.isdir(directory) else ()):
    problem = _unlisted_problem(os.path.join(directory, name)) if name.isdigit() else None
    if problem is not None:
      found.append((name, problem))
  # Every host has scanned before process 0 moves anything, so all find the same steps and
  # all reach the barrier below together (orbax's manager syncs the hosts here anyway).
  distributed.barrier("scan_unlisted_steps")
  moved = []
  for name, problem in found:
    source = os.path.join(directory, name)
    target = os.path.join(damaged_dir, f"{os.path.basename(os.path.abspath(directory))}_{name}_"
                          f"{time.strftime('%Y%m%d-%H%M%S')}")
    if jax.process_index() == 0:
      os.makedirs(damaged_dir, exist_ok=True)
      shutil.move(source, target)
    moved.append(target)
    errors.warn(f"skipping damaged checkpoint {source}: {problem}; moved to {target}")
  if found:
    distributed.barrier("set_aside_unlisted_steps")
  return moved


class _RaisedAgainFilter(logging.Filter):
  """Drops the log records of a failed save that :func:`checkpoints.save_checkpoint` and
  :func:`checkpoints.finish_saves` report in one line: orbax's record of an exception in one
  of its write threads (``_SignalingThread.run() raised an exception``), which orbax raises
  again where the save is waited for, and asyncio's ``Task exception was never retrieved`` of
  the other writes of that save (those whose exception names a ``<step>.orbax-checkpoint-tmp``
  folder), logged whenever the garbage collector frees them, which may be after the one line;
  and orbax's record of a Ctrl-C or SIGTERM (``KeyboardInterrupt``, ``errors.Terminated``) that
  landed in ``CheckpointManager.wait_until_finished`` (``Save Finalize thread ... failed``),
  which orbax raises again and train.py reports in its one line. Other records pass."""

  def filter(self, record: logging.LogRecord) -> bool:
    if (record.pathname.endswith(os.path.join("futures", "future.py"))
        and "_SignalingThread.run() raised an exception" in str(record.msg)):
      return False
    error = record.exc_info[1] if record.exc_info else None
    if (isinstance(error, KeyboardInterrupt) and "[wait_until_finished]" in str(record.msg)
        and record.pathname.endswith("checkpoint_manager.py")):
      return False
    return not (record.name == "asyncio" and "never retrieved" in str(record.msg)
                and error is not None and ".orbax-checkpoint-tmp" in str(error))

_RAISED_AGAIN = _RaisedAgainFilter()


def quiet_reported_failures() -> None:
  """Installs, once, what keeps a failed save or restore to the one line its caller reports:
  :class:`_RaisedAgainFilter` on the ``absl`` and ``asyncio`` loggers and
  :func:`quiet_abandoned_reads`."""
  for logger in ("absl", "asyncio"):
    if _RAISED_AGAIN not in logging.getLogger(logger).filters:
      logging.getLogger(logger).addFilter(_RAISED_AGAIN)
  quiet_abandoned_reads()


def _is_closed_loop_callback(value: BaseException | None, tb) -> bool:
  """An orbax read abandoned by a failed restore: tensorstore finishing it after orbax closed
  its event loop (``RuntimeError: Event loop is closed`` in ``call_soon_threadsafe``)."""
  return (isinstance(value, RuntimeError) and str(value) == "Event loop is closed"
          and any(frame.name == "call_soon_threadsafe"
                  for frame in traceback.extract_tb(tb)))


def quiet_abandoned_reads() -> None:
  """Installs, once, a ``sys.unraisablehook`` that hides the ``Event loop is closed`` error of
  each read or write that a failed restore or save abandoned (docs/faults.md); the failure is
  reported once, by the caller."""
  previous = sys.unraisablehook
  if getattr(previous, "drops_abandoned_reads", False):
    return

  def hook(unraisable):
    if not _is_closed_loop_callback(unraisable.exc_value, unraisable.exc_traceback):
      previous(unraisable)

  hook.drops_abandoned_reads = True
  sys.unraisablehook = hook


# The operating system's causes of a failed write (errno's texts), which orbax and tensorstore
# bury in long messages and chained exceptions: a full disk, a file-size limit (ulimit -f), a
# folder that lost write permission, a read-only or over-quota file system, an I/O error.
STORAGE_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EACCES, errno.EPERM, errno.EROFS,
                  errno.EDQUOT, errno.EIO)


def storage_cause(error: BaseException) -> str | None:
  """The operating system's cause of a failed write found in ``error``, its chained causes or
  their messages (e.g. ``"File too large"``, ``"No space left on device"``, with the file an
  ``OSError`` names); None if none is named. Only the first found is given."""
  seen, current = set(), error
  while current is not None and id(current) not in seen:
    seen.add(id(current))
    if isinstance(current, OSError) and current.errno in STORAGE_ERRNOS:
      return os.strerror(current.errno) + (f": {current.filename}" if current.filename else "")
    text = str(current)
    for number in STORAGE_ERRNOS:
      if os.strerror(number) in text:
        return os.strerror(number)
    current = current.__cause__ or current.__context__
  return None


def save_failure(error: BaseException) -> str:
  """How a failed save is named: the operating system's cause (:func:`storage_cause`), else
  the error's type and first line."""
  cause = storage_cause(error)
  return (f"{cause} ({type(error).__name__})" if cause is not None
          else f"{type(error).__name__}: {first_line(error)}")


# How long a save that a second signal or an error abandons may go on writing what it started
# before its threads are cancelled (:func:`abandon_save`).
ABANDON_WAIT_SECONDS = 60.0


def _save_threads() -> list[threading.Thread]:
  """orbax's threads that write or finish a save and are still running (orbax 0.12: each
  commit's ``_SignalingThread``, the manager's ``_FinalizeThread``, the asynchronous
  checkpointer's ``async_save``). None is a daemon: one left running when ``train.py``'s main
  thread ends goes on while Python shuts down and fails there, as Python's thread pools then
  refuse new work (``RuntimeError: cannot schedule new futures after shutdown``)."""
  from orbax.checkpoint._src.futures import future  # pylint: disable=import-outside-toplevel
  kinds = tuple(kind for kind in (getattr(future, "_SignalingThread", None),
                                  getattr(ocp_manager, "_FinalizeThread", None))
                if isinstance(kind, type))
  current = threading.current_thread()
  return [thread for thread in threading.enumerate()
          if thread is not current and thread.is_alive()
          and (isinstance(thread, kinds) or thread.name == "async_save")]


def _join(threads: list[threading.Thread], timeout: float | None) -> None:
  """Waits for ``threads`` to end, at most ``timeout`` seconds in all (None: no limit), with
  ``threading.Thread.join`` (orbax's ``_SignalingThread.join`` raises the thread's error)."""
  deadline = None if timeout is None else time.monotonic() + timeout
  for thread in threads:
    threading.Thread.join(thread, None if deadline is None
                          else max(0.0, deadline - time.monotonic()))


def join_save_threads(timeout: float | None = None) -> None:
  """Waits for orbax's save threads still running (:func:`_save_threads`), at most
  ``timeout`` seconds (None: no limit)."""
  _join(_save_threads(), timeout)


def abandon_save(manager: ocp.CheckpointManager, step: int | None) -> None:
  """Ends a save of ``step`` that failed or that a second signal stopped: waits for orbax's
  threads still writing it (:data:`ABANDON_WAIT_SECONDS` at most, then cancels those left), so
  that none outlives the run and prints a traceback at its exit, then removes the half-written
  ``<step>.orbax-checkpoint-tmp*`` folder (:func:`_remove_partial`). The steps saved before
  stay. ``step`` None: the threads only."""
  _join(_save_threads(), ABANDON_WAIT_SECONDS)
  left = _save_threads()
  for thread in left:
    cancel = getattr(thread, "cancel", None)
    if callable(cancel):
      cancel()
  _join(left, 5.0)
  if step is not None:
    _remove_partial(manager, step)


# How long the half-written folder of an abandoned save must stay absent before
# :func:`_remove_partial` trusts that no write of that save is left (seconds).
REMOVE_QUIET_SECONDS = 0.5

# The errors of a removal that races a write still finishing (a file or folder created or
# removed under ``shutil.rmtree``): the removal is tried again; any other error ends it.
_RACE_ERRNOS = (errno.ENOENT, errno.ENOTEMPTY)


def _remove_partial(manager: ocp.CheckpointManager, step: int) -> None:
  """Removes what a failed save of ``step`` left in the manager's folder (orbax's
  ``<step>.orbax-checkpoint-tmp*`` folders; process 0), so that no half-written step stays.

  tensorstore finishes a write that the save had started on its own threads, after orbax's
  threads have ended, and creates its folders again (seen 10 ms after a removal, under load):
  the folders are removed until none has come back for :data:`REMOVE_QUIET_SECONDS`, within
  :data:`ABANDON_WAIT_SECONDS`. A folder that cannot be removed for another reason (no write
  permission) is left as it is, at once; the caller's error names the failure."""
  if jax.process_index() != 0:
    return
  pattern = os.path.join(str(manager.directory), f"{step}.orbax-checkpoint-tmp*")
  failed: list[OSError] = []

  def on_error(function, path, exc_info):   # pylint: disable=unused-argument
    if not (isinstance(exc_info[1], OSError) and exc_info[1].errno in _RACE_ERRNOS):
      failed.append(exc_info[1])

  deadline = time.monotonic() + ABANDON_WAIT_SECONDS
  quiet_until = time.monotonic() + REMOVE_QUIET_SECONDS
  while not failed and time.monotonic() < min(quiet_until, deadline):
    paths = glob.glob(pattern)
    for path in paths:
      shutil.rmtree(path, onerror=on_error)
    if paths:
      quiet_until = time.monotonic() + REMOVE_QUIET_SECONDS
    time.sleep(0.01)


def first_line(error: BaseException, limit: int = 300) -> str:
  """The first line of ``error``'s message, at most ``limit`` characters."""
  text = str(error).strip().splitlines()
  return (text[0] if text else "")[:limit]
