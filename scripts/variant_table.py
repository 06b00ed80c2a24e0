"""Trains every attention variant with the same config, steps and seed, and tabulates test
accuracy: the README's per-variant ListOps table (issue 3).

Usage::

    python scripts/variant_table.py --task listops --variant tiny --steps 300 --warmup 200 --jobs 2
    python scripts/variant_table.py ... --copy_to results/listops_tiny_table  # commit-ready

Each run is ``python train.py --config configs/<task>/<model>.py:<variant>`` with
``--config.num_train_steps=<steps> --config.eval_frequency=<eval_every>
--config.warmup=<warmup>`` and any ``--config.<field>=<value>`` given here (the syntax of
``train.py``, :mod:`simpletron_jax.runtime.overrides`), in ``<runs>/<model>`` (``--runs``, default
``runs/<task>_<variant>_table``). A run is reused only when its ``results.json`` is a finished
run of this very config: complete, at this step count, and with this config's
``config_fingerprint`` (:func:`simpletron_jax.run.run_record.workdir_results_problem`, as
``scripts/seeds.py`` checks). Any other run is trained again in its folder, which resumes from
its checkpoint (``train.py`` refuses a checkpoint of other settings, naming them; choose
another ``--runs`` then); the reason it did not count is printed. With ``--jobs 2`` two runs
go side by side, each pinned to its own CPU core (``taskset``) so their timings do not disturb
each other.

The script writes ``table.md`` and ``table.json`` in the runs folder. Nothing under
``results/`` changes unless ``--copy_to DIR`` is given: then each run's ``results.json``,
``config.json`` and ``metrics.jsonl`` (never checkpoints) and the two tables are copied into
``DIR``. Flags are spelled with underscores, as train.py's; the dashed ``--eval-every`` and
``--copy-to`` are accepted until the next release, with a note.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import sys
from typing import Callable, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from simpletron_jax.runtime import cli, overrides  # noqa: E402  pylint: disable=C0413
from simpletron_jax.tools import reporting  # noqa: E402  pylint: disable=C0413
from simpletron_jax.run import run_record  # noqa: E402  pylint: disable=C0413

RUN_FILES = ("results.json", "config.json", "metrics.jsonl")
TABLE_FILES = ("table.md", "table.json")
# Trains one run: ``train(cmd, workdir, name)`` runs the train.py command line ``cmd``.
TrainFn = Callable[[list, str, str], None]


def config_name(name: str) -> str:
  """The config file stem of a registered attention (``softmax`` is ``transformer``)."""
  return "transformer" if name == "softmax" else name


def config_spec(task: str, variant: str, name: str) -> str:
  """``configs/<task>/<model>.py[:<variant>]`` of attention ``name`` (no suffix for ``''``)."""
  spec = f"configs/{task}/{config_name(name)}.py"
  return f"{spec}:{variant}" if variant else spec


def run_overrides(steps: int, eval_every: int, warmup: int,
                  extra: Sequence[str] = ()) -> list[str]:
  """The ``--config.*`` arguments of every run: the length flags, then ``extra``."""
  return [f"--config.num_train_steps={steps}", f"--config.eval_frequency={eval_every}",
          f"--config.warmup={warmup}", *extra]


def subprocess_train(core: int | None = None) -> TrainFn:
  """A :data:`TrainFn` running the command in a child process from the repository root
  (pinned to CPU ``core`` with ``taskset`` when given and available), its output appended to
  ``<workdir>/train.log``.

  Raises (from the returned function):
    RuntimeError: if train.py exits non-zero; the message names the log file.
  """
  def train(cmd: list, workdir: str, name: str) -> None:
    if core is not None and shutil.which("taskset"):
      cmd = ["taskset", "-c", str(core)] + cmd
    reporting.run_logged(cmd, ROOT, os.path.join(workdir, "train.log"), name)
  return train


def run_one(task: str, variant: str, name: str, config_overrides: Sequence[str], run_root: str,
            train: TrainFn, log: Callable[[str], None] = print) -> dict:
  """Trains one variant unless its folder holds a finished run of this config, and returns
  its ``results.json``.

  Args:
    task, variant, name: the config (``configs/<task>/<model>.py:<variant>``) and attention.
    config_overrides: ``--config.<field>=<value>`` arguments (:func:`run_overrides`).
    run_root: the folder holding one workdir per model.
    train: runs a train.py command line (:func:`subprocess_train`).
    log: where the reason a ``results.json`` did not count is printed.

  Returns:
    The parsed ``results.json``.

  Raises:
    RuntimeError: if train.py fails (naming the log), or its ``results.json`` still does not
      count after training (naming the reason).
    ValueError: a config that cannot be loaded or an override it refuses (one line).
  """
  spec = config_spec(task, variant, name)
  expected = overrides.load_config(spec, config_overrides)
  workdir = os.path.join(run_root, config_name(name))
  problem = run_record.workdir_results_problem(workdir, expected)
  if problem is not None:
    if problem != "no results.json":
      log(f"{name}: {workdir} not reused: {problem}")
    os.makedirs(workdir, exist_ok=True)
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--config", spec, "--workdir",
           workdir, *config_overrides]
    train(cmd, workdir, name)
    problem = run_record.workdir_results_problem(workdir, expected)
    if problem is not None:
      raise RuntimeError(f"{name}: training ended, but {problem}")
  with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
    return json.load(f)


def table_lines(args, names: Sequence[str], rows: dict, failures: dict) -> list[str]:
  """The markdown table: one row per attention, with the train.py command of each run."""
  lines = ["| attention | test acc. (%) | best val (%) @ step | steps/s | train min | command |",
           "|---|---|---|---|---|---|"]
  for name in names:
    if name not in rows:
      lines.append(f"| `{name}` | failed | | | | {failures.get(name, '')} |")
      continue
    r = rows[name]
    cmd = " ".join(["python train.py --config", config_spec(args.task, args.variant, name),
                    *run_overrides(args.steps, args.eval_every, args.warmup,
                                   args.config_overrides)])
    lines.append(f"| `{name}` | {100 * reporting.protocol_accuracy(r, 'best_val'):.1f} | "
                 f"{100 * r['best_val_accuracy']:.1f} @ {r['best_step']} | "
                 f"{r['steps_per_sec']:.2f} | {r['train_seconds'] / 60:.1f} | `{cmd}` |")
  return lines


def copy_out(run_root: str, rows: dict, dest: str) -> None:
  """Copies each finished run's :data:`RUN_FILES` (never checkpoints) and the tables from
  ``run_root`` into ``dest``."""
  for name in rows:
    out = os.path.join(dest, config_name(name))
    os.makedirs(out, exist_ok=True)
    for file in RUN_FILES:
      path = os.path.join(run_root, config_name(name), file)
      if os.path.exists(path):
        shutil.copy(path, out)
  for file in TABLE_FILES:
    shutil.copy(os.path.join(run_root, file), dest)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """The flags; ``config_overrides`` holds the ``--config.<field>=<value>`` arguments.

  Raises:
    SystemExit: a bad invocation: one line, status 1 (cli.ArgumentParser.error).
  """
  parser = overrides.OverrideParser(
      prog="variant_table.py", description=__doc__.split("\n\n")[0],
      epilog="--config.<field>=<value> (repeatable) sets a config field of every run, as for "
             "train.py")
  parser.add_argument("--task", default="listops")
  parser.add_argument("--variant", default="tiny", help="the config variant ('' for none)")
  parser.add_argument("--steps", type=int, default=300, help="optimizer steps per run")
  parser.add_argument("--eval_every", type=int, default=150, help="steps between validations")
  parser.add_argument("--warmup", type=int, default=200, help="learning-rate warmup steps")
  parser.add_argument("--names", nargs="*", default=None, help="default: every registered one")
  parser.add_argument("--jobs", type=int, default=1, help="runs side by side, one core each")
  parser.add_argument("--runs", default=None,
                      help="folder of the runs and the tables "
                           "(default runs/<task>_<variant>_table)")
  parser.add_argument("--copy_to", default=None, metavar="DIR",
                      help="also copy the run files and tables here, e.g. "
                           "results/<task>_<variant>_table to refresh the committed ones")
  return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None, train_for: Callable[[int | None], TrainFn] =
         subprocess_train) -> dict:
  """Parses flags, runs the variants, writes the table (and copies it with ``--copy_to``).

  Args:
    argv: the arguments (default ``sys.argv[1:]``).
    train_for: ``core -> TrainFn`` (tests replace the train.py child process).

  Returns:
    The ``table.json`` contents.
  """
  args = parse_args(argv)
  # After the flags: the attention registry imports JAX.
  from simpletron_jax.model import attention  # pylint: disable=import-outside-toplevel
  names = args.names or attention.names()
  tag = f"{args.task}_{args.variant}_table"
  run_root = os.path.abspath(args.runs or os.path.join(ROOT, "runs", tag))
  os.makedirs(run_root, exist_ok=True)
  config_overrides = run_overrides(args.steps, args.eval_every, args.warmup,
                                   args.config_overrides)
  for name in names:   # a bad config or override stops here, before anything trains
    overrides.load_config(config_spec(args.task, args.variant, name), config_overrides)
  cores = list(range(args.jobs)) if args.jobs > 1 else [None]
  rows, failures = {}, {}
  with concurrent.futures.ThreadPoolExecutor(len(cores)) as pool:
    free = list(cores)
    pending = {}
    queue = list(names)
    while queue or pending:
      while queue and free:
        name, core = queue.pop(0), free.pop(0)
        pending[pool.submit(run_one, args.task, args.variant, name, config_overrides,
                            run_root, train_for(core))] = (name, core)
      done, _ = concurrent.futures.wait(pending, return_when="FIRST_COMPLETED")
      for fut in done:
        name, core = pending.pop(fut)
        free.append(core)
        try:
          rows[name] = fut.result()
          print(f"{name}: test {reporting.protocol_accuracy(rows[name], 'best_val'):.4f}",
                flush=True)
        except RuntimeError as err:
          failures[name] = cli.one_line(str(err))
          print(err, file=sys.stderr, flush=True)
  lines = table_lines(args, names, rows, failures)
  table = {"task": args.task, "variant": args.variant, "steps": args.steps,
           "eval_every": args.eval_every, "warmup": args.warmup,
           "config_overrides": args.config_overrides, "results": rows, "failures": failures}
  with open(os.path.join(run_root, "table.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  with open(os.path.join(run_root, "table.json"), "w") as f:
    json.dump(table, f, indent=2)
  if args.copy_to:
    copy_out(run_root, rows, args.copy_to)
  print("\n".join(lines))
  return table


if __name__ == "__main__":
  with cli.user_errors_exit("variant_table.py", dirs=(ROOT,)):
    main()
