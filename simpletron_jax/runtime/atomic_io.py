"""Every file a run writes is whole or untouched, and a failed write is one line.

:func:`write_text_atomic` and :func:`write_json_atomic` write to a temporary file, fsync it and
rename it over the target, so a reader sees the old file or the whole new one; on a full disk
or a read-only folder they raise :class:`simpletron_jax.runtime.errors.WriteError` naming the file
and the OS error (:func:`write_error` builds that message for the writers that stream, such as
:mod:`simpletron_jax.run.metric_logging`, which append with :func:`append_whole`).
:func:`json_safe` turns non-finite floats into ``null``, so every JSON file the run writes
stays strict JSON. :func:`atomic_path` gives the same guarantee to a writer that needs a path
(``np.savez``, a tar member, a stream).

No JAX here.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import tempfile
from typing import Any, Iterator, Mapping

import numpy as np

from simpletron_jax.runtime.errors import WriteError


def json_safe(obj: Any) -> Any:
  """``obj`` with every non-finite float replaced by None (JSON ``null``), recursively."""
  if isinstance(obj, Mapping):
    return {k: json_safe(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [json_safe(v) for v in obj]
  if isinstance(obj, (float, np.floating)) and not math.isfinite(obj):
    return None
  return obj


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
  """A temporary path beside ``path`` (same folder, so the rename is atomic) that replaces
  ``path`` when the ``with`` block ends cleanly; on any exception it is removed and ``path``
  is left as it was.

  Args:
    path: the file to write; its folder is created if missing.

  Yields:
    The temporary path to write (mode 0644 once renamed).

  Raises:
    OSError: the folder cannot be created or the rename fails.
  """
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                             dir=folder)
  os.close(fd)
  try:
    yield tmp
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(tmp)
    raise


def write_text_atomic(path: str, text: str) -> None:
  """Writes ``text`` to ``path`` so that ``path`` is either the old file or the whole new one.

  The text goes to ``path + ".tmp"``, is flushed and fsynced, then renamed over ``path``
  (``os.replace``, atomic on POSIX). A failed write (``ENOSPC``, ``EROFS``, ``EACCES``) removes
  the temporary file and leaves ``path`` as it was.

  Args:
    path: the file to write; its folder must exist.
    text: the whole contents (UTF-8).

  Raises:
    WriteError: naming ``path`` and the OS error, when any step fails.
  """
  tmp = path + ".tmp"
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except OSError as e:
    try:
      os.remove(tmp)
    except OSError:
      pass
    raise WriteError(f"could not write {path}: {e.strerror or e} (errno {e.errno}); the "
                     "previous file, if any, is unchanged. Free space or fix the folder's "
                     "permissions, then rerun the same command to continue.") from e


def write_json_atomic(path: str, obj: Any, indent: int | None = 2) -> None:
  """:func:`write_text_atomic` of ``obj`` as strict JSON (non-finite floats become ``null``,
  see :func:`json_safe`).

  Raises:
    WriteError: as :func:`write_text_atomic`.
    TypeError: if ``obj`` holds a value JSON cannot encode.
  """
  write_text_atomic(path, json.dumps(json_safe(obj), indent=indent, allow_nan=False) + "\n")


def write_error(path: str, error: OSError, kept: str = "what was written before is kept",
                what: str = "") -> WriteError:
  """The one-line :class:`WriteError` for a failed write of ``path`` (not raised).

  Args:
    path: the file that could not be written.
    error: the ``OSError`` (``ENOSPC``, ``EROFS``, ``EACCES``, ``EIO``...).
    kept: what the reader can still rely on, for the message.
    what: the kind of file, named before the path (``"the TensorBoard events file"``).
  """
  return WriteError(f"could not write {what + ' ' if what else ''}{path}: "
                    f"{error.strerror or error} (errno {error.errno}); "
                    f"{kept}. Free space or fix the folder's permissions, then rerun the same "
                    "command to continue.")


def append_whole(file: Any, data: bytes, end: int, path: str, kept: str, what: str = ""
                 ) -> None:
  """Appends ``data`` to ``file`` (open for binary appending, ``end`` bytes long) and hands it
  to the OS, all or nothing: a write that stops part-way (a full disk, a file-size limit) is
  cut back to ``end``, so no torn record stays for a rerun to drop.

  Raises:
    WriteError: :func:`write_error` of ``path``, ending with ``kept`` and naming ``what``.
  """
  view = memoryview(data)
  try:
    while view:
      written = file.write(view)
      if not written:
        raise OSError(errno.EIO, f"{os.strerror(errno.EIO)} (a write wrote nothing)")
      view = view[written:]
    file.flush()
  except OSError as e:
    try:
      os.ftruncate(file.fileno(), end)
    except OSError:
      pass
    raise write_error(path, e, kept, what) from e
