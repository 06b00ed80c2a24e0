"""Trains one config over several seeds, resuming killed seeds, and summarizes both protocols.

Usage::

    python scripts/seeds.py --config configs/listops/simple.py:tiny --seeds 0 1 2 3 4 \\
        --workdir-root runs/listops_simple_tiny_seeds --config.num_train_steps=300

Arguments after the known flags that start with ``--config.`` are passed to every
``train.py`` call. Seed ``s`` trains in ``<workdir-root>/seed<s>`` with
``--config.seed=s`` (which also seeds the data order and, for ListOps, the generated
data). A seed whose folder has ``results.json`` is done and is not trained again; any
other seed runs ``train.py`` on its folder, which resumes from its newest checkpoint.
The script then writes ``summary.json`` and ``summary.md`` in the root: per-seed test
accuracy under both protocols (best-validation checkpoint, final step), their mean ± std
(sample std) and the best seed (``simpletron_jax.reporting``). ``--copy-to DIR`` also
copies every seed's ``config.json``, ``metrics.jsonl`` and ``results.json`` (never the
checkpoints) and the summary into ``DIR``, ready to commit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import Any, Callable, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from simpletron_jax import reporting  # noqa: E402  pylint: disable=wrong-import-position

RUN_FILES = ("config.json", "metrics.jsonl", "results.json")
TrainFn = Callable[[int, str], None]


def seed_dir(root: str, seed: int) -> str:
  """The workdir of ``seed`` under ``root``."""
  return os.path.join(root, f"seed{seed}")


def seed_state(workdir: str) -> str:
  """``"done"`` (has results.json), ``"resume"`` (has a checkpoint) or ``"new"``."""
  if os.path.exists(os.path.join(workdir, "results.json")):
    return "done"
  ckpts = os.path.join(workdir, "checkpoints")
  if os.path.isdir(ckpts) and any(name.isdigit() for name in os.listdir(ckpts)):
    return "resume"
  return "new"


def subprocess_trainer(config: str, overrides: Sequence[str], nice: int = 0) -> TrainFn:
  """A TrainFn running ``train.py --config <config> --workdir <dir> --config.seed=<s>
  <overrides>`` in a child process, its output in ``<dir>/train.log``.

  Raises (from the returned function):
    RuntimeError: if train.py exits non-zero; the message names the log.
  """
  def train(seed: int, workdir: str) -> None:
    os.makedirs(workdir, exist_ok=True)
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--config", config,
           "--workdir", workdir, f"--config.seed={seed}", *overrides]
    if nice:
      cmd = ["nice", "-n", str(nice)] + cmd
    reporting.run_logged(cmd, ROOT, os.path.join(workdir, "train.log"), f"seed {seed}")
  return train


def run_seeds(seeds: Sequence[int], root: str, train: TrainFn,
              log: Callable[[str], None] = print) -> dict[int, dict[str, Any]]:
  """Trains every seed that is not done, one after the other.

  Args:
    seeds: the seeds, in order.
    root: the folder holding ``seed<s>`` workdirs.
    train: called as ``train(seed, workdir)`` for each seed not done; it must write
      ``workdir/results.json`` (train.py does) and resume from the workdir's checkpoint.
    log: progress messages.

  Returns:
    seed -> results.json contents, for every seed.

  Raises:
    FileNotFoundError: if ``train`` returned without writing results.json.
  """
  results = {}
  for seed in seeds:
    workdir = seed_dir(root, seed)
    state = seed_state(workdir)
    log(f"seed {seed}: {state} ({workdir})")
    if state != "done":
      train(seed, workdir)
    path = os.path.join(workdir, "results.json")
    if not os.path.exists(path):
      raise FileNotFoundError(f"seed {seed}: training ended without writing {path}")
    with open(path) as f:
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
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", required=True, help="as for train.py, e.g. "
                      "configs/listops/simple.py:tiny")
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
  parser.add_argument("--workdir-root", default=None,
                      help="default: runs/seeds/<config file stem>_<variant>")
  parser.add_argument("--copy-to", default=None, help="copy run files and summary here")
  parser.add_argument("--nice", type=int, default=0, help="run train.py under nice -n N")
  args, overrides = parser.parse_known_args(argv)
  bad = [o for o in overrides if not o.startswith("--config.")]
  if bad:
    parser.error(f"unrecognized arguments {bad}: only --config.<field>=<value> overrides "
                 "are passed on to train.py")
  stem = os.path.splitext(os.path.basename(args.config.split(":")[0]))[0]
  variant = args.config.split(":")[1] if ":" in args.config else "paper"
  root = args.workdir_root or os.path.join(ROOT, "runs", "seeds", f"{stem}_{variant}")
  os.makedirs(root, exist_ok=True)
  results = run_seeds(args.seeds, root, subprocess_trainer(args.config, overrides, args.nice))
  title = " ".join([args.config, *overrides])
  summary = write_summary(results, root, title)
  if args.copy_to:
    copy_runs(args.seeds, root, args.copy_to)
  print(reporting.summary_markdown(summary, title))
  return summary


if __name__ == "__main__":
  main()
