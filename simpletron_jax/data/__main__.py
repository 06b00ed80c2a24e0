"""``python -m simpletron_jax.data where|prepare|verify``: each task's data, in one command.

    python -m simpletron_jax.data where                                   # every task
    python -m simpletron_jax.data prepare --task image --from ~/data/cifar-10-python.tar.gz
    python -m simpletron_jax.data prepare --task retrieval --from ~/data/lra_release.gz
    python -m simpletron_jax.data prepare --task listops --config configs/listops/simple.py:tiny
    python -m simpletron_jax.data verify --task text
    python -m simpletron_jax.data verify listops      # each generated size in the cache

The task's data settings (``data.data_dir``, ``data.tfds_data_dir``, the generator
arguments and seed) are its record's defaults, or those of a ``--config`` file, with
``--config.<field>=<value>`` overrides, as for ``train.py``. ``--from`` is a downloaded file (or
the folder it was unpacked to), ``--dest`` the folder to write into (default ``~/data``, where
the loaders look). The task may be given as ``--task`` or as the word after the command. The
tasks are those of the registry (:mod:`simpletron_jax.data.tasks`). What each command does:
:mod:`simpletron_jax.data.prepare`; docs/data.md gives the commands task by task. Nothing is
downloaded. A missing source, a damaged file or a bad flag ends with one line and exit status
1; ``verify`` also exits 1 when a check fails; Ctrl-C ends with one line and exit status 130,
leaving no folder that ``prepare`` began in the cache.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from simpletron_jax.data import prepare as prep
from simpletron_jax.data import tasks
from simpletron_jax.runtime import cli, overrides

PROGRAM = "python -m simpletron_jax.data"
INTERRUPTED = 130
"""The exit status after Ctrl-C (128 + SIGINT), as a shell reports it."""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  """The command and its flags; ``config_overrides`` holds the ``--config.*`` arguments.

  Raises:
    SystemExit: argparse's usage error.
  """
  parser = overrides.OverrideParser(prog=PROGRAM, description=__doc__.split("\n\n")[0],
                                   epilog="--config.<field>=<value> (repeatable) overrides a "
                                          "config field, as for train.py")
  names = ", ".join(tasks.names())
  parser.add_argument("command", choices=("where", "prepare", "verify"))
  parser.add_argument("task_word", nargs="?", default=None, metavar="TASK",
                      help="the task, as --task")
  parser.add_argument("--task", default=None,
                      help=f"one of {names} (where: default every task)")
  parser.add_argument("--config", default=None,
                      help="a config file whose data settings to use (default: the "
                           "task's own, the published size)")
  parser.add_argument("--from", dest="source", default=None, metavar="PATH",
                      help="prepare: the downloaded file or unpacked folder; verify: a "
                           "downloaded file to check against its published MD5")
  parser.add_argument("--dest", default=None,
                      help="prepare: the folder to write into (default ~/data)")
  parser.add_argument("--workers", type=int, default=None,
                      help="prepare: generator processes for ListOps and Pathfinder "
                           "(default: every CPU)")
  args = parser.parse_args(list(argv))
  if args.task_word is not None:
    if args.task is not None and args.task != args.task_word:
      parser.error(f"two tasks: {args.task_word!r} and --task {args.task!r}")
    args.task = args.task_word
  if args.command != "where" and args.task is None:
    parser.error(f"{args.command} needs --task (one of {names})")
  if args.task is not None and args.task not in tasks.names():
    parser.error(f"--task {args.task!r}: not a task; the tasks: {names}")
  if args.config and args.task is None:
    parser.error("--config needs --task")
  return args


def run(args: argparse.Namespace) -> int:
  """Runs the parsed command, printing its lines.

  Returns:
    The exit status: 1 when ``verify`` finds a failed check, else 0.

  Raises:
    ValueError, OSError: user errors (one line, see :mod:`simpletron_jax.data.prepare`).
  """
  if args.command == "where":
    for task in ([args.task] if args.task else tasks.names()):
      data = prep.task_config(task, args.config, args.config_overrides)
      print(prep.where(task, data).line(), flush=True)
    return 0
  data = prep.task_config(args.task, args.config, args.config_overrides)
  if args.command == "prepare":
    found = prep.prepare(args.task, data, args.source, args.dest, args.workers,
                         log=lambda line: print(line, flush=True))
    print(found.line())
    return 0
  failed = False
  found = [data] if args.config else prep.configs_to_verify(args.task, data)
  for one in found:
    for status, line in prep.verify(args.task, one, args.source):
      print(f"{status}: {line}", flush=True)
      failed |= status == "FAIL"
  return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
  """The command line; a user error ends as one line ``python -m simpletron_jax.data: ...``.

  Returns:
    The exit status (see :func:`run`); :data:`INTERRUPTED` after Ctrl-C, with one line.
  """
  args = parse_args(sys.argv[1:] if argv is None else argv)
  try:
    with cli.user_errors_exit(PROGRAM), cli.sigint_raises():
      return run(args)
  except KeyboardInterrupt:
    print(f"{PROGRAM}: interrupted; nothing half-made is left in the cache, run the command "
          "again to start over", file=sys.stderr, flush=True)
    return INTERRUPTED


if __name__ == "__main__":
  sys.exit(main())
