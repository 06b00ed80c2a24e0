"""Trains one config over several seeds, resuming killed seeds, and summarizes both protocols.

Usage::

    python scripts/seeds.py --config configs/listops/simple.py:tiny --seeds 0 1 2 3 4 \\
        --workdir_root runs/listops_simple_tiny_seeds --config.num_train_steps=300

Arguments after the known flags that start with ``--config.`` are passed to every
``train.py`` call. Seed ``s`` trains in ``<workdir_root>/seed<s>`` with
``--config.seed=s`` (which also seeds the data order and, for ListOps, the generated
data). A seed is done, and not trained again, when its folder's ``results.json`` describes a
finished run of this very config: ``"complete": true``, ``final_step`` equal to
``num_train_steps`` and the ``config_fingerprint`` of the config train.py gets
(``run_record.results_problem``). Any other seed runs ``train.py`` on its folder, which resumes
from its newest checkpoint; a ``results.json`` that does not count is named with the reason
(incomplete, another step count or config, a NaN, or resumed with ``--allow_resume_changes``:
its numbers mix two configs, and ``--count_forced`` counts it anyway). A seed that still does
not count after training stops the script with a one-line error, as does a failed or preempted
``train.py`` (with train.py's own one-line error from its log; status 75 after a preemption,
which saved the seed's step: rerun to continue). SIGINT or SIGTERM sent to this script is
passed on to the running train.py once per signal (:func:`run_relayed`). While a seed trains, train.py's
progress lines (a line every 30 s for the data generation and the training), its validations,
its result and its one-line error are also printed here, after ``seed <s>:``
(:data:`RELAYED`); all of its output goes to the seed's ``train.log``.
The script then writes ``summary.json`` and ``summary.md`` in the root: per-seed test
accuracy under both protocols (best-validation checkpoint, final step), their mean ± std
(sample std) and the best seed (``simpletron_jax.tools.reporting``). ``--copy_to DIR`` also
copies every seed's ``config.json``, ``metrics.jsonl`` and ``results.json`` (never the
checkpoints) and the summary into ``DIR``, ready to commit; a ``DIR`` that is a file is
refused before any training, as is a ``--workdir_root`` under a file or through a broken
symbolic link. Flags are spelled with underscores, as train.py's; the former dashed spelling
(``--workdir-root``) is accepted until the next release, with a note.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from typing import Any, Callable, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from simpletron_jax.runtime import cli, errors  # noqa: E402  pylint: disable=C0413
from simpletron_jax.runtime import overrides as overrides_lib  # noqa: E402  pylint: disable=C0413
from simpletron_jax.tools import reporting  # noqa: E402  pylint: disable=C0413
from simpletron_jax.run import run_record  # noqa: E402  pylint: disable=C0413
# simpletron_jax.run.preemption (PREEMPTED_EXIT_CODE) imports JAX: imported where it is read, so
# --help and a bad invocation end before JAX loads.

RUN_FILES = ("config.json", "metrics.jsonl", "results.json")
# The lines of train.py's output that are also printed while a seed trains: progress
# ("train: 120/5000 (2%), ..." and "ListOps examples: ..."), validations ("step 200: val
# accuracy ..."), a resume, the result ("test accuracy ...") and a one-line error.
RELAYED = re.compile(r"^(\S[^:|]*: \d+/\d+ \(|step \d+: |Resumed from |test accuracy |"
                     r"train\.py: |SIGTERM|SIGINT)")
TrainFn = Callable[[int, str], None]
ConfigFn = Callable[[int], Any]   # seed -> the ml_collections.ConfigDict train.py builds


class SeedError(RuntimeError):
  """A seed could not be finished: train.py failed or was preempted, or its results.json
  still does not count; the message (one line) names the seed, the cause and the file."""


class SeedPreempted(SeedError):
  """train.py was preempted (SIGTERM or SIGINT) after saving; the script exits with
  ``preemption.PREEMPTED_EXIT_CODE`` (75), as train.py does, and a rerun continues."""


def seed_dir(root: str, seed: int) -> str:
  """The workdir of ``seed`` under ``root``."""
  return os.path.join(root, f"seed{seed}")


# Why ``workdir/results.json`` does not count as a finished run of ``config`` (None: it does).
results_status = run_record.workdir_results_problem


def seed_state(workdir: str, config: Any = None, count_forced: bool = False) -> str:
  """``"done"`` (its results.json counts, see :func:`results_status`; ``count_forced``: also
  a run resumed with ``--allow_resume_changes``), ``"resume"`` (has a checkpoint) or
  ``"new"``."""
  if results_status(workdir, config, count_forced=count_forced) is None:
    return "done"
  ckpts = os.path.join(workdir, "checkpoints")
  if os.path.isdir(ckpts) and any(name.isdigit() for name in os.listdir(ckpts)):
    return "resume"
  return "new"


def expected_config(config: str, overrides: Sequence[str], seed: int):
  """The config ``train.py --config <config> <overrides> --config.seed=<seed>`` trains
  (parsed by ml_collections' config flags, as train.py parses it).

  Args:
    config: a config file, relative to the repository root or absolute, with an optional
      ``:variant``.
    overrides: ``--config.<field>=<value>`` arguments.
    seed: the seed.

  Returns:
    An ``ml_collections.ConfigDict``.

  Raises:
    SeedError: the file or an override cannot be loaded (one line).
  """
  path, colon, variant = config.partition(":")
  spec = (path if os.path.isabs(path) else os.path.join(ROOT, path)) + colon + variant
  try:
    return overrides_lib.load_config(spec, [*overrides, f"--config.seed={seed}"])
  except ValueError as e:
    raise SeedError(f"cannot load --config {config} with overrides "
                    f"{' '.join(overrides) or '(none)'}: {e}") from None


def run_relayed(cmd: list[str], cwd: str, log: str, what: str,
                relay: Callable[[str], None] = print) -> None:
  """Runs ``cmd`` (a ``train.py`` command line) in ``cwd``, appending its stdout and stderr to
  the file ``log`` and passing each line that :data:`RELAYED` matches, as it comes, to ``relay``
  after ``"<what>: "``.

  The child runs in its own session, so a Ctrl-C or a scheduler's signal to this script's
  process group reaches it once, through this script: SIGINT or SIGTERM here is passed on to
  train.py (which saves its step and exits 75), and the script waits for it; a second one is
  passed on too (train.py then stops at once).

  Raises:
    RuntimeError: if it exits non-zero; the message names ``what``, the exit code, the run's
      own one-line error when it printed one (``train.py: <cause>``) and ``log``.
  """
  env = {**os.environ, "PYTHONUNBUFFERED": "1"}   # each line as it is printed
  lines = []
  with open(log, "a", encoding="utf-8") as f, cli.sigterm_raises():
    with subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          env=env, text=True, errors="replace",
                          start_new_session=True) as proc:
      while True:
        try:
          for line in proc.stdout:
            f.write(line)
            f.flush()
            lines.append(line)
            if RELAYED.match(line.strip()):
              relay(f"{what}: {line.strip()}")
          break
        except KeyboardInterrupt as e:   # SIGINT, or SIGTERM (errors.Terminated)
          signum = signal.SIGTERM if isinstance(e, errors.Terminated) else signal.SIGINT
          if proc.poll() is None:
            proc.send_signal(signum)
            relay(f"{what}: {signum.name} passed on to train.py; waiting for it to stop")
  if proc.returncode:
    cause = reporting.last_error_line("".join(lines))
    raise RuntimeError(f"{what}: train.py exited {proc.returncode}"
                       + (f": {cause}" if cause else "") + f"; see {log}")


def subprocess_trainer(config: str, overrides: Sequence[str], nice: int = 0,
                       relay: Callable[[str], None] = print) -> TrainFn:
  """A TrainFn running ``train.py --config <config> --workdir <dir> --config.seed=<s>
  <overrides>`` in a child process, its output in ``<dir>/train.log`` and, line by line, on
  ``relay`` (:func:`run_relayed`).

  Raises (from the returned function):
    SeedError: if train.py exits non-zero (the message names the log) or was preempted
      (exit status ``preemption.PREEMPTED_EXIT_CODE``: rerun to continue).
  """
  def train(seed: int, workdir: str) -> None:
    os.makedirs(workdir, exist_ok=True)
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--config", config,
           "--workdir", workdir, f"--config.seed={seed}", *overrides]
    if nice:
      cmd = ["nice", "-n", str(nice)] + cmd
    log = os.path.join(workdir, "train.log")
    try:
      run_relayed(cmd, ROOT, log, f"seed {seed}", relay)
    except RuntimeError as e:
      from simpletron_jax.run import preemption  # pylint: disable=import-outside-toplevel
      if re.search(rf"exited {preemption.PREEMPTED_EXIT_CODE}[:;]", str(e)):
        raise SeedPreempted(f"seed {seed}: train.py was preempted (SIGTERM or SIGINT) after "
                            "saving a checkpoint; rerun the same command to continue (log: "
                            f"{log})") from None
      raise SeedError(str(e)) from None
  return train


def run_seeds(seeds: Sequence[int], root: str, train: TrainFn,
              log: Callable[[str], None] = print,
              config_for: ConfigFn | None = None,
              count_forced: bool = False) -> dict[int, dict[str, Any]]:
  """Trains every seed that is not done, one after the other.

  Args:
    seeds: the seeds, in order.
    root: the folder holding ``seed<s>`` workdirs.
    train: called as ``train(seed, workdir)`` for each seed not done; it must write
      ``workdir/results.json`` (train.py does) and resume from the workdir's checkpoint.
    log: progress messages, including each results.json not counted and why.
    config_for: ``seed -> config`` the seed must have been trained with (its step count and
      ``config_fingerprint`` are checked); None: any complete, finite results.json counts.
    count_forced: count a run resumed with ``--allow_resume_changes`` (``results.json``'s
      ``forced_resume_changes``) as finished. By default it is not; training the seed again
      cannot undo the change, so the script stops with one line (train.py's refused resume,
      or the check after training).

  Returns:
    seed -> results.json contents, for every seed.

  Raises:
    SeedError: a seed's results.json still does not count after ``train`` returned (the
      reason: missing, incomplete, another config, a NaN).
  """
  results = {}
  for seed in seeds:
    workdir = seed_dir(root, seed)
    config = config_for(seed) if config_for else None
    state = seed_state(workdir, config, count_forced)
    problem = results_status(workdir, config, count_forced=count_forced)
    skipped = ("" if state == "done" or problem == "no results.json"
               else f"; not counted: {problem}")
    log(f"seed {seed}: {state} ({workdir}){skipped}")
    if state != "done":
      train(seed, workdir)
      problem = results_status(workdir, config, count_forced=count_forced)
      if problem is not None:
        raise SeedError(f"seed {seed}: training ended, but {problem}")
    with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
      results[seed] = json.load(f)
  return results


def write_summary(results: dict[int, dict[str, Any]], root: str, title: str) -> dict[str, Any]:
  """Writes ``summary.json`` and ``summary.md`` in ``root`` and returns the summary."""
  summary = reporting.summarize_seeds(results)
  summary["title"] = title
  with open(os.path.join(root, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  with open(os.path.join(root, "summary.md"), "w") as f:
    f.write(reporting.summary_markdown(summary, title))
  return summary


def copy_target_problem(dest: str) -> str | None:
  """Why ``dest`` cannot receive :func:`copy_runs`' files (one line), or None: it, or a
  folder above it, is a file; or the nearest existing folder above it is not writable."""
  path = os.path.abspath(dest)
  while True:
    if os.path.exists(path):
      if not os.path.isdir(path):
        return (f"{path} is a file, not a folder: pass a folder (created if missing) or move "
                "the file away")
      if not os.access(path, os.W_OK | os.X_OK):
        return f"{path} is not writable: pass a folder in a writable place"
      return None
    parent = os.path.dirname(path)
    if parent == path:
      return None
    path = parent


def copy_runs(seeds: Sequence[int], root: str, dest: str) -> None:
  """Copies each seed's run files (not its checkpoints) and the summary to ``dest``."""
  for seed in seeds:
    out = seed_dir(dest, seed)
    os.makedirs(out, exist_ok=True)
    for name in RUN_FILES:
      shutil.copy(os.path.join(seed_dir(root, seed), name), out)
  for name in ("summary.json", "summary.md"):
    shutil.copy(os.path.join(root, name), dest)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  """Parses the flags, trains the seeds, writes and prints the summary."""
  parser = cli.ArgumentParser(prog="seeds.py", description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", required=True, help="as for train.py, e.g. "
                      "configs/listops/simple.py:tiny")
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
  parser.add_argument("--workdir_root", default=None,
                      help="default: runs/seeds/<config file stem>_<variant>")
  parser.add_argument("--copy_to", default=None, help="copy run files and summary here "
                      "(a folder, created if missing)")
  parser.add_argument("--nice", type=int, default=0, help="run train.py under nice -n N")
  parser.add_argument("--count_forced", action="store_true",
                      help="count a seed resumed with train.py --allow_resume_changes as "
                      "finished (its results.json lists the forced changes; docs/runs.md)")
  args, overrides = parser.parse_known_args(argv)
  bad = [o for o in overrides if not o.startswith("--config.")]
  if bad:
    parser.error(f"unrecognized arguments {bad}: only --config.<field>=<value> overrides "
                 "are passed on to train.py")
  stem = os.path.splitext(os.path.basename(args.config.split(":")[0]))[0]
  variant = args.config.split(":")[1] if ":" in args.config else "paper"
  root = args.workdir_root or os.path.join(ROOT, "runs", "seeds", f"{stem}_{variant}")
  if args.copy_to:   # before any training, not after it
    problem = copy_target_problem(args.copy_to)
    if problem:
      raise SystemExit(f"seeds.py: --copy_to {args.copy_to}: {problem}")
  try:
    cli.check_workdir(root, "--workdir_root")
  except (ValueError, OSError) as e:
    raise SystemExit(f"seeds.py: {cli.one_line(str(e))}") from None
  try:
    os.makedirs(root, exist_ok=True)
  except OSError as e:
    raise SystemExit(f"seeds.py: --workdir_root {root!r} cannot be created: "
                     f"{e.strerror or e} ({e.filename or root}); pass a folder in a writable "
                     "place") from None
  try:
    results = run_seeds(args.seeds, root, subprocess_trainer(args.config, overrides, args.nice),
                        config_for=lambda seed: expected_config(args.config, overrides, seed),
                        count_forced=args.count_forced)
  except SeedPreempted as e:   # saved: 75, as train.py, so a scheduler reruns the command
    from simpletron_jax.run import preemption  # pylint: disable=import-outside-toplevel
    print(f"seeds.py: {e}", file=sys.stderr)
    raise SystemExit(preemption.PREEMPTED_EXIT_CODE) from None
  except SeedError as e:  # a named cause: one line, no traceback
    raise SystemExit(f"seeds.py: {e}") from None
  title = " ".join([args.config, *overrides])
  summary = write_summary(results, root, title)
  if args.copy_to:
    copy_runs(args.seeds, root, args.copy_to)
  print(reporting.summary_markdown(summary, title))
  return summary


if __name__ == "__main__":
  main()
