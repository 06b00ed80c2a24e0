"""Trains every attention variant with the same config, steps and seed, and tabulates test
accuracy: the README's per-variant ListOps table (issue 3).

Usage::

    python scripts/variant_table.py --task listops --variant tiny --steps 300 --warmup 200 --jobs 2

Each run is ``python train.py --config configs/<task>/<model>.py:<variant>`` with
``--config.num_train_steps=<steps> --config.warmup=<warmup>`` in ``runs/<task>_<variant>_table/<model>``; a finished
run (a complete ``results.json``) is not trained again; a killed or time-limited one resumes
from its checkpoint. With ``--jobs 2`` two runs go side by side, each pinned to its own CPU core
(``taskset``) so their timings do not disturb each other. The script copies each run's
``results.json``, ``config.json`` and ``metrics.jsonl`` to ``results/<task>_<variant>_table/``
and writes ``table.md`` and ``table.json`` there.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from simpletron_jax import attention, reporting, run_record  # noqa: E402  pylint: disable=C0413


def config_name(name: str) -> str:
  """The config file stem of a registered attention (``softmax`` is ``transformer``)."""
  return "transformer" if name == "softmax" else name


def run_one(task: str, variant: str, name: str, steps: int, eval_every: int, warmup: int,
            core: int | None, run_root: str) -> dict:
  """Trains one variant (or finds it done) and returns its results.json contents.

  Raises:
    RuntimeError: if train.py fails; the message names the log file.
  """
  workdir = os.path.join(run_root, config_name(name))
  results = os.path.join(workdir, "results.json")
  # missing, or e.g. stopped by max_train_minutes: (re)run, resuming from its checkpoint
  if run_record.workdir_results_problem(workdir) is not None:
    os.makedirs(workdir, exist_ok=True)
    cmd = [sys.executable, "train.py", "--config",
           f"configs/{task}/{config_name(name)}.py:{variant}", "--workdir", workdir,
           f"--config.num_train_steps={steps}", f"--config.eval_frequency={eval_every}",
           f"--config.warmup={warmup}"]
    if core is not None and shutil.which("taskset"):
      cmd = ["taskset", "-c", str(core)] + cmd
    reporting.run_logged(cmd, ROOT, os.path.join(workdir, "train.log"), name)
  with open(results) as f:
    return json.load(f)


def main(argv=None) -> None:
  """Parses flags, runs the variants, writes the table."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--task", default="listops")
  parser.add_argument("--variant", default="tiny")
  parser.add_argument("--steps", type=int, default=300, help="optimizer steps per run")
  parser.add_argument("--eval-every", type=int, default=150, help="steps between validations")
  parser.add_argument("--warmup", type=int, default=200, help="learning-rate warmup steps")
  parser.add_argument("--names", nargs="*", default=None, help="default: every registered one")
  parser.add_argument("--jobs", type=int, default=1, help="runs side by side, one core each")
  args = parser.parse_args(argv)
  names = args.names or attention.names()
  tag = f"{args.task}_{args.variant}_table"
  run_root = os.path.join(ROOT, "runs", tag)
  out_dir = os.path.join(ROOT, "results", tag)
  os.makedirs(out_dir, exist_ok=True)
  cores = list(range(args.jobs)) if args.jobs > 1 else [None]
  rows, failures = {}, {}
  with concurrent.futures.ThreadPoolExecutor(len(cores)) as pool:
    free = list(cores)
    pending = {}
    queue = list(names)
    while queue or pending:
      while queue and free:
        name, core = queue.pop(0), free.pop(0)
        pending[pool.submit(run_one, args.task, args.variant, name, args.steps,
                            args.eval_every, args.warmup, core, run_root)] = (name, core)
      done, _ = concurrent.futures.wait(pending, return_when="FIRST_COMPLETED")
      for fut in done:
        name, core = pending.pop(fut)
        free.append(core)
        try:
          rows[name] = fut.result()
          print(f"{name}: test {rows[name]['test_accuracy']:.4f}", flush=True)
        except RuntimeError as err:
          failures[name] = str(err)
          print(err, file=sys.stderr, flush=True)
  for name in rows:
    dest = os.path.join(out_dir, config_name(name))
    os.makedirs(dest, exist_ok=True)
    for file in ("results.json", "config.json", "metrics.jsonl"):
      shutil.copy(os.path.join(run_root, config_name(name), file), dest)
  lines = [f"| attention | test acc. (%) | best val (%) @ step | steps/s | train min | command |",
           "|---|---|---|---|---|---|"]
  for name in names:
    if name not in rows:
      lines.append(f"| `{name}` | failed | | | | {failures.get(name, '')} |")
      continue
    r = rows[name]
    cmd = (f"`python train.py --config configs/{args.task}/{config_name(name)}.py:{args.variant}"
           f" --config.num_train_steps={args.steps} --config.eval_frequency={args.eval_every}"
           f" --config.warmup={args.warmup}`")
    lines.append(f"| `{name}` | {100 * r['test_accuracy']:.1f} | "
                 f"{100 * r['best_val_accuracy']:.1f} @ {r['best_step']} | "
                 f"{r['steps_per_sec']:.2f} | {r['train_seconds'] / 60:.1f} | {cmd} |")
  with open(os.path.join(out_dir, "table.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  with open(os.path.join(out_dir, "table.json"), "w") as f:
    json.dump({"task": args.task, "variant": args.variant, "steps": args.steps,
               "results": rows, "failures": failures}, f, indent=2)
  print("\n".join(lines))


if __name__ == "__main__":
  main()
