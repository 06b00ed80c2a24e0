"""The command-line boundary of ``train.py``, ``eval.py`` and ``scripts/experiments/*``:
one line, no traceback, for every user error.

A *user error* is an exception the project raises itself with a message that names the cause,
the file or config field and what to do: a :class:`simpletron_jax.runtime.errors.RunError`, or a
``ValueError`` / ``OSError`` (``FileNotFoundError``, ``NotADirectoryError``, ...) whose
traceback ends in the project's own code (the package, or the folders a script names, e.g. the
repository's ``configs/``). It is printed as ``<program>: <message>`` on one line and the
program exits with status 1. Anything else (an error inside JAX, orbax, grain, or any other
exception type) is a bug and keeps its traceback; so does every error under ``--verbose``.

Flag parsing (:func:`parse_flags`) turns ml_collections' errors into the same one line: a
missing config file (with or without ``--config.<field>`` overrides), a config file that does
not load (a syntax error, a failed import), a ``:variant`` the config does not have (with the
known ones), a ``--config.<field>`` the config lacks, a value absl cannot parse, a stray
positional argument; an override of a field the config lacks is named alone, with the
nearest names. :func:`check_path_name` refuses a ``--workdir`` whose name is not UTF-8, and
:func:`check_workdir` also one under a file or through a broken symbolic link.

One flag style: long options are spelled with underscores, as absl spells them
(``--workdir_root``); :class:`ArgumentParser` gives the argparse scripts that style, with
their former dashed spelling accepted for one release (a deprecation note), and
``--help`` prints plain text (:func:`plain_help`, :func:`plain_text`).

This module imports no JAX, so a flag error is reported before JAX starts.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import gc
import os
import re
import signal
import sys
import threading
import traceback
import warnings
from typing import Iterable, Iterator, Sequence

from absl import flags
from ml_collections import config_flags

from simpletron_jax.runtime import config_files, errors

# The package's folder, and the one above it (in a checkout: configs/ and .git/ are there).
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_ROOT = os.path.dirname(PACKAGE_DIR)
# The exception types a user error can have (besides errors.RunError).
USER_ERROR_TYPES = (ValueError, OSError)


def one_line(message: str) -> str:
  """``message`` with its lines joined by single spaces (empty lines dropped)."""
  return " ".join(line.strip() for line in str(message).splitlines() if line.strip())


def raised_in(error: BaseException, dirs: Iterable[str]) -> bool:
  """True when the innermost frame of ``error``'s traceback lies in one of ``dirs``.

  Files under a ``site-packages`` or ``dist-packages`` folder never count, so a virtual
  environment inside the repository is not mistaken for the project's code.
  """
  frames = traceback.extract_tb(error.__traceback__)
  if not frames:
    return False
  filename = os.path.abspath(frames[-1].filename)
  if any(part in ("site-packages", "dist-packages") for part in filename.split(os.sep)):
    return False
  return any(filename.startswith(os.path.abspath(d) + os.sep) for d in dirs)


def user_error_message(error: BaseException, dirs: Iterable[str] = ()) -> str | None:
  """The one-line message of a user error (see the module docstring), or None for a bug.

  Args:
    error: the exception.
    dirs: folders of project code besides the package (a script's own folder, ``configs/``).

  Returns:
    ``"<ErrorType>: <message>"`` for a :class:`errors.RunError` (its type names the
    cause: ``ConfigMismatchError``, ``NonFiniteError``, ...), the message for a
    ``ValueError`` or ``OSError`` raised in the project's code, else None.
  """
  if isinstance(error, errors.RunError):
    return one_line(f"{type(error).__name__}: {error}")
  if isinstance(error, USER_ERROR_TYPES) and raised_in(error, (PACKAGE_DIR, *dirs)):
    return one_line(str(error))
  return None


@contextlib.contextmanager
def user_errors_exit(program: str, verbose: bool = False,
                     dirs: Sequence[str] = ()) -> Iterator[None]:
  """Turns a user error raised in the ``with`` block into ``SystemExit("<program>: ...")``
  (printed on stderr, exit status 1); other exceptions, and all under ``verbose``, pass.

  Args:
    program: the name printed first (``"train.py"``).
    verbose: the program's ``--verbose``: keep every traceback.
    dirs: see :func:`user_error_message`.
  """
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except  (re-raised unless a user error)
    message = None if verbose else user_error_message(e, dirs)
    if message is None:
      raise
    raise SystemExit(f"{program}: {message}") from None


def _flag_error_message(error: flags.Error) -> str:
  """absl's message for a flag value it refused; for an error inside a config file's
  ``get_config`` (e.g. an unknown ``:variant``) the flag and that error's last line, not the
  config file's traceback that ml_collections puts in the message."""
  lines = [line for line in str(error).splitlines() if line.strip()]
  if len(lines) > 1 and "Traceback" in str(error):
    flag_part = lines[0].split(": Error whilst parsing config file")[0]
    cause = re.sub(r"^\w+(Error|Exception): ", "", lines[-1].strip())
    return f"{flag_part.strip()}: {cause}"
  return one_line(str(error))


def _unknown_flag_message(error: flags.UnrecognizedFlagError,
                          flag_values: flags.FlagValues) -> str:
  """absl's "Unknown command line flag", as a missing config field with the nearest names
  when the flag is a ``--config.<field>`` override."""
  name = getattr(error, "flagname", "") or ""
  if not name.startswith("config.") or "config" not in flag_values:
    return f"{one_line(str(error))} (see --help)"
  field = name[len("config."):]
  try:
    known = config_files.config_fields(flag_values["config"].value)
  except OSError as e:   # the config file itself failed to load: that is the cause
    return config_files.config_file_message(
        config_flags.get_config_filename(flag_values["config"]), e)
  close = difflib.get_close_matches(field, known, n=3)
  hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
  return (f"--config.{field}: the config has no field {field!r}{hint}; overrides set existing "
          "fields only, e.g. --config.batch_size=8")


def _missing_override_message(argv: Sequence[str], error: BaseException) -> str:
  """One line naming the one ``--config.<field>`` override of ``argv`` whose field the config
  lacks (ml_collections' error names only the last part of its path), with the nearest
  existing names.

  The config is loaded again without overrides to find it; when that fails, the override is
  the first whose dotted path holds the key the error names.
  """
  given = [a for a in argv[1:] if a.startswith("--config.")]
  key = re.search(r"'(\w+)", str(error))
  key = key.group(1) if key else None
  spec = config_files.config_spec(argv)
  if spec is not None:
    try:
      config = config_files.read_config(spec)
    except (ValueError, OSError, SyntaxError, ImportError, flags.Error):
      config = None
    for override in given if config is not None else ():
      name = override.split("=", 1)[0]
      missing = config_files.missing_field(config, name[len("--config."):])
      if missing:
        section, part, close = missing
        names = ", ".join(map(repr, close))
        return (f"{name}: the config has no field {part!r}"
                f"{f' in {section!r}' if section else ''}"
                f"{f' (did you mean {names}?)' if close else ''}; overrides set existing "
                "fields only")
  for override in given:
    name = override.split("=", 1)[0]
    parts = name[len("--config."):].split(".")
    if key in parts:
      section = ".".join(parts[:parts.index(key)])
      return (f"{name}: the config has no field {key!r}{f' in {section!r}' if section else ''}"
              "; overrides set existing fields only")
  return f"the config has no field {key or str(error)!r}; overrides set existing fields only"


def parse_flags(argv: list[str], program: str,
                flag_values: flags.FlagValues = flags.FLAGS) -> list[str]:
  """absl's flag parsing (``app.run(main, flags_parser=...)``) with one-line errors.

  Exits with status 1 and ``<program>: <cause>`` for: a ``--config.<field>`` override of a
  field the config lacks (with the nearest field names); an unknown flag; a flag value
  absl refuses, including an error raised by the config file's ``get_config`` such as an
  unknown ``:variant`` (its message lists the known ones); a ``--config`` file that does not
  exist (listing the configs in its folder), with or without overrides; a config file that
  does not load (a ``SyntaxError`` with its file and line, a failed import); a positional
  argument (the programs take flags only; absl would print its whole help first).

  Args:
    argv: ``sys.argv``.
    program: the name printed first.
    flag_values: the flags to parse into (absl's global ``FLAGS`` by default).

  Returns:
    The arguments left after the flags (``argv[0]`` and positional ones).

  Raises:
    SystemExit: for the errors above.
  """
  plain_help(flag_values)
  try:
    rest = flag_values(argv)
  except (AttributeError, KeyError) as e:
    raise SystemExit(f"{program}: {_missing_override_message(argv, e)}. The options of a "
                     "variant are listed under model.attention_kwargs in its config, e.g. "
                     "python -c \"from configs.listops import simple; "
                     "print(simple.get_config('tiny').model)\"") from None
  except flags.UnrecognizedFlagError as e:
    raise SystemExit(f"{program}: {_unknown_flag_message(e, flag_values)}") from None
  except flags.Error as e:
    raise SystemExit(f"{program}: {_flag_error_message(e)} (see --help)") from None
  except (OSError, SyntaxError, ImportError) as e:   # the config file, loaded while parsing
    raise SystemExit(f"{program}: " + config_files.config_file_message(
        config_files.config_filename(argv, flag_values), e)) from None
  if "config" in flag_values and flag_values["config"].value is not None:
    try:
      getattr(flag_values.config, "keys")   # ml_collections defers a load error to first use
    except OSError as e:
      raise SystemExit(f"{program}: " + config_files.config_file_message(
          config_files.config_filename(argv, flag_values), e)) from None
  if len(rest) > 1:
    raise SystemExit(f"{program}: unexpected argument(s) {' '.join(map(repr, rest[1:]))}: "
                     f"{program} takes flags only, as --name=value (quote a value that holds "
                     "spaces or brackets, e.g. --config.freeze=\"('^encoder/',)\"); "
                     "see --help")
  return rest


# Each signal a ``with`` block below turns into an exception: the exception's class and
# arguments, and whether it arrived (set inside the block, cleared when it ends).
_ERRORS = {signal.SIGTERM: (errors.Terminated, "SIGTERM"), signal.SIGINT: (KeyboardInterrupt,)}
_RECEIVED = {signum: threading.Event() for signum in _ERRORS}


def _error(signum: int) -> KeyboardInterrupt:
  kind, *args = _ERRORS[signum]
  return kind(*args)


@contextlib.contextmanager
def _signal_raises(signum: int) -> Iterator[None]:
  """In the ``with`` block signal ``signum`` raises its :data:`_ERRORS` exception in the main
  thread and is remembered (:func:`raise_if_terminated`); Python's report of that exception
  when it drops it is left out. Off the main thread: nothing changes."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  received, kind = _RECEIVED[signum], _ERRORS[signum][0]

  def _raise(signum, frame):  # pylint: disable=unused-argument
    received.set()
    raise _error(signum)

  active = True   # read by _unraisable, which outlives the block when a later hook wraps it

  def _unraisable(lost):   # raised again by raise_if_terminated, so not printed
    if not (active and isinstance(lost.exc_value, kind)):
      hook(lost)

  previous, hook = signal.signal(signum, _raise), sys.unraisablehook
  sys.unraisablehook = _unraisable
  try:
    yield
  finally:
    signal.signal(signum, signal.SIG_DFL if previous is None else previous)
    # A hook installed inside the block (checkpoint_faults.quiet_abandoned_reads) wraps this
    # one and stays: putting back the one found at entry would drop it.
    active = False
    if sys.unraisablehook is _unraisable:
      sys.unraisablehook = hook
    received.clear()


def sigterm_raises() -> contextlib.AbstractContextManager[None]:
  """In the ``with`` block SIGTERM raises :class:`errors.Terminated` in the main thread instead
  of ending the process, so that clean-up runs and the program can say what was saved; handlers
  installed inside (the run's preemption guard) take over meanwhile. Off the main thread: none."""
  return _signal_raises(signal.SIGTERM)


def sigint_raises() -> contextlib.AbstractContextManager[None]:
  """In the ``with`` block SIGINT (Ctrl-C) raises ``KeyboardInterrupt``, as Python's own
  handler does, and is remembered, so that :func:`raise_if_terminated` raises it again when
  Python dropped it. Where SIGINT has another handler than Python's (ignored, as in a job a
  shell starts in the background): nothing changes. Off the main thread: none."""
  if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
    return contextlib.nullcontext()
  return _signal_raises(signal.SIGINT)


def raise_if_terminated() -> None:
  """Raises :class:`errors.Terminated` (``KeyboardInterrupt``) if SIGTERM (SIGINT) arrived inside
  :func:`sigterm_raises` (:func:`sigint_raises`) and its exception was lost: Python drops an
  exception raised while a garbage-collector callback or a finalizer runs (JAX's
  ``_xla_gc_callback``). The generators' waits for workers call this."""
  for signum, received in _RECEIVED.items():
    if received.is_set():
      raise _error(signum)


def release_interrupted(error: BaseException) -> None:
  """Frees, here and without a report, what a signal stopped halfway: the objects held by the
  frames of ``error``'s traceback (and of the exceptions it chains), e.g. an orbax save's event
  loop whose ``__init__`` the signal's exception left without ``_debug``, and its coroutines
  never awaited. Their finalizers' errors (``sys.unraisablehook``) and "coroutine ... was never
  awaited" warnings are dropped, then the hook and the warning filters found on entry are put
  back. Call it after catching the exception of :func:`sigterm_raises` or :func:`sigint_raises`
  and before the program's last line; otherwise Python frees those frames when the ``except``
  clause ends, or at exit, and prints a traceback there.

  Args:
    error: the caught exception; its traceback and its chained exceptions' are cleared.
  """
  previous = sys.unraisablehook
  sys.unraisablehook = lambda lost: None
  try:
    with warnings.catch_warnings():
      warnings.filterwarnings("ignore", r"coroutine .* was never awaited", RuntimeWarning)
      while error is not None:
        error.__traceback__, error = None, error.__context__
      gc.collect()   # the frames' reference cycles
  finally:
    sys.unraisablehook = previous


def plain_text(text: str) -> str:
  """``text`` (a docstring, a flag's help) without its reStructuredText markup, for
  ``--help``: ``:func:`x``` becomes ``x`` and double backquotes go."""
  text = re.sub(r":[\w:.-]+:`~?([^`]*)`", r"\1", text)
  return text.replace("``", "")


def plain_help(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Makes absl's ``--help`` plain text: the main module's docstring (absl prints it first)
  and every flag's help lose their reStructuredText markup (:func:`plain_text`)."""
  main = sys.modules.get("__main__")
  if main is not None and getattr(main, "__doc__", None):
    main.__doc__ = plain_text(main.__doc__)
  for flag in flag_values._flags().values():   # pylint: disable=protected-access
    if flag.help:
      flag.help = plain_text(flag.help)


class ArgumentParser(argparse.ArgumentParser):
  """``argparse.ArgumentParser`` with the flag style of ``train.py`` (absl's): long options
  are written with underscores (``--workdir_root``).

  For one release the dashed spelling of an option defined with underscores
  (``--workdir-root``) is still accepted, with a deprecation note on stderr; an option still
  defined with dashes also takes its underscore spelling, silently. ``--help`` is plain text
  (:func:`plain_text`); a bad invocation ends with one line and status 1 (:meth:`error`).
  ``--config.<field>`` overrides are left as they are.
  """

  def parse_known_args(self, args=None, namespace=None):  # pylint: disable=signature-differs
    """As argparse's, after :meth:`underscored` has respelled the flags."""
    args = sys.argv[1:] if args is None else list(args)
    return super().parse_known_args(self.underscored(args), namespace)

  def underscored(self, args: Sequence[str]) -> list[str]:
    """``args`` with each long option respelled as the parser defines it (see the class
    docstring); prints one deprecation line per dashed option given."""
    known = {s for action in self._actions for s in action.option_strings}
    out = []
    for i, arg in enumerate(args):
      if arg == "--":
        return out + list(args[i:])
      name, eq, value = arg.partition("=")
      if name.startswith("--") and name not in known and not name.startswith("--config."):
        underscore, dash = "--" + name[2:].replace("-", "_"), "--" + name[2:].replace("_", "-")
        if underscore in known and "-" in name[2:]:
          print(f"{self.prog}: {name} is deprecated: write {underscore} (flags are spelled with "
                "underscores, as train.py's; the dashed form goes in the next release)",
                file=sys.stderr)
          arg = underscore + eq + value
        elif dash in known:
          arg = dash + eq + value
      out.append(arg)
    return out

  def format_help(self) -> str:
    """argparse's help, as plain text."""
    return plain_text(super().format_help())

  def error(self, message: str):
    """A bad invocation (a missing or unknown flag, a bad value): one line,
    ``<prog>: <message> (see --help)``, and exit status 1, as ``train.py``'s flag errors;
    argparse's own prints the usage first and exits 2."""
    self.exit(1, f"{self.prog}: {message} (see --help)\n")


def check_workdir(path: str, flag: str = "--workdir") -> None:
  """Refuses a workdir that cannot be a folder, naming the cause: a name that is not UTF-8
  (:func:`check_path_name`); a file, or a symbolic link to something that does not exist, on
  its path (``path`` itself or a folder above it).

  Args:
    path: the folder as given (it need not exist: a run creates it).
    flag: the flag that gave it, for the message.

  Raises:
    ValueError: its name is not UTF-8 text.
    NotADirectoryError: ``path`` or a folder above it is a file; names that file.
    FileNotFoundError: ``path`` or a folder above it is a symbolic link whose target does not
      exist; names the link and its target.
  """
  check_path_name(path, flag)
  parts, head = [], os.path.abspath(path)
  while True:
    parts.append(head)
    parent = os.path.dirname(head)
    if parent == head:
      break
    head = parent
  for part in reversed(parts):   # the root first
    if os.path.islink(part) and not os.path.exists(part):
      raise FileNotFoundError(
          f"{flag} {path!r}: {part} is a symbolic link to {os.readlink(part)!r}, which does not "
          "exist: create the folder it points to, or remove the link")
    if not os.path.exists(part):
      return
    if not os.path.isdir(part):
      if part == os.path.abspath(path):
        raise NotADirectoryError(f"{flag} {path!r} is a file, not a folder: pass a folder "
                                 "(created if missing) or move the file away")
      raise NotADirectoryError(f"{flag} {path!r}: {part} is a file, so no folder can be "
                               "created under it: pass a folder in another place, or move "
                               "the file away")


def check_path_name(path: str, flag: str) -> None:
  """Refuses a path whose name is not UTF-8 text.

  Python hands a command-line byte that is not UTF-8 over as a lone surrogate
  (``surrogateescape``); the run writes its folder's name into UTF-8 logs and JSON files
  (``metrics.jsonl``, TensorBoard, ``config.json``), which cannot hold it.

  Args:
    path: the path as given.
    flag: the flag that gave it, for the message (``--workdir``).

  Raises:
    ValueError: one line naming the flag, the path (escaped) and the bytes that are not UTF-8.
  """
  try:
    path.encode("utf-8")
  except UnicodeEncodeError as e:
    bad = path[e.start:e.end]
    try:
      shown = repr(bad.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:
      shown = ascii(bad)
    raise ValueError(f"{flag} {ascii(path)}: its name holds {shown}, which is not UTF-8 text; "
                     "the run writes its folder's name into UTF-8 logs and JSON files: use a "
                     "name of UTF-8 characters only") from None
