"""Self-pretraining then fine-tuning, against training from scratch, over tasks, attentions
and seeds (Amos et al., ICLR 2024; :mod:`simpletron_jax.pretraining`).

Usage::

    python scripts/spt.py --tasks listops text --attentions simple transformer linear \\
        --seeds 0 1 2 --size tiny --spt-steps 300 --ft-steps 300 \\
        --workdir-root runs/spt_tiny --copy-to results/spt_tiny

For each task, attention and seed, three runs in ``<root>/<task>_<attention>/seed<s>/``:

* ``spt``: ``configs/<task>/<attention>.py:<size>_spt`` (masked-token denoising on the
  training split) for ``--spt-steps`` steps;
* ``ft``: ``:<size>_spt_ft`` with ``init_from`` = the ``spt`` run (the encoder copied, the
  classifier head new) for ``--ft-steps`` steps;
* ``scratch``: ``:<size>`` for the same ``--ft-steps`` steps and the same schedule; at the
  paper size (``--size ''``) with the same recipe as ``ft`` too (the SPT code's fine-tuning
  optimisation, :func:`simpletron_jax.pretraining.apply_paper_recipe`), so the two arms
  differ only in their initialisation.

``--spt-steps`` / ``--ft-steps`` (optimizer steps) default to the configs' own: at the paper
size the SPT code's epochs and warmups, at ``tiny`` the ``tiny`` schedule.

``--table-only`` trains nothing and rewrites the tables from the runs found.
``--warmup`` (default 10% of each run's steps when its steps are given, else the config's)
and ``--set FIELD=VALUE`` (a dotted config field, the value read as a Python literal, else a
string; repeatable) apply to all three;
``--spt-set FIELD=VALUE`` to the pretraining runs only (e.g. their learning rate), so the two
arms still fine-tune with the same recipe.
A run whose ``results.json`` says ``"complete": true`` with its step count is not trained
again; any other resumes from its checkpoints. After each seed the script writes
``table.md`` and ``table.json`` in the root (and, with ``--copy-to DIR``, copies them and
every run's ``config.json`` and ``results.json``, never checkpoints, into ``DIR``). The
table gives the mean ± sample std over the seeds done of the test accuracy at the final step
(both arms have the same number of fine-tuning steps) and at the best-validation step, and
the pretraining's masked-token accuracy on the validation split.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

STAGES = ("spt", "ft", "scratch")


def parse_set(items) -> dict:
  """``["a.b=1", ...]`` -> ``{"a.b": 1}``; values are Python literals where they parse.

  Raises:
    ValueError: an item without ``=``, naming it (flag ``--set``).
  """
  out = {}
  for item in items or ():
    if "=" not in item:
      raise ValueError(f"--set {item!r}: expected FIELD=VALUE")
    key, value = item.split("=", 1)
    try:
      out[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      out[key] = value
  return out


def stage_config(task: str, attention: str, size: str, stage: str, seed: int,
                 steps: int | None, warmup: int | None, overrides: dict, init_from: str = ""):
  """The config of one run (``stage`` in :data:`STAGES`) from ``configs/<task>/<attention>.py``.

  ``steps`` (optimizer steps; None: the config's own) also sets the validation and
  checkpoint interval to one per run, and the warmup to 10% of it unless ``warmup`` is
  given.

  Raises:
    ValueError: an unknown task, attention or variant (from ``configs/lra.py``), or an
      override naming a field the config lacks.
  """
  import importlib  # pylint: disable=import-outside-toplevel
  module = importlib.import_module(f"configs.{task}.{attention}")
  variant = {"spt": f"{size}_spt", "ft": f"{size}_spt_ft", "scratch": size}[stage]
  variant = variant.lstrip("_") or None
  config = module.get_config(variant)
  if stage == "scratch" and not size:   # the paper size: the fine-tuning arm's recipe
    from simpletron_jax import pretraining  # pylint: disable=import-outside-toplevel
    pretraining.apply_paper_recipe(config, "ft")
  config.seed = seed
  if steps is not None:
    config.num_train_steps = steps
    config.warmup = max(1, steps // 10)
    config.eval_frequency = steps
    config.checkpoint_every = steps
  if warmup is not None:
    config.warmup = warmup
  for key, value in overrides.items():
    holder = config
    *path, last = key.split(".")
    for part in path:
      holder = holder[part]
    if last not in holder:
      raise ValueError(f"--set {key}: the config has no such field")
    holder[last] = value
  if init_from:
    config.init_from = init_from
  return config


def run_done(workdir: str, steps: int) -> bool:
  """Whether ``workdir/results.json`` is a finished run of ``steps`` steps."""
  path = os.path.join(workdir, "results.json")
  if not os.path.exists(path):
    return False
  with open(path) as f:
    results = json.load(f)
  return bool(results.get("complete")) and results.get("final_step") == steps


def _mean_std(values) -> str:
  if not values:
    return "-"
  if len(values) == 1:
    return f"{100 * values[0]:.1f}"
  return f"{100 * statistics.mean(values):.1f} ± {100 * statistics.stdev(values):.1f}"


def write_table(root: str, args) -> dict:
  """Collects every finished seed under ``root`` into ``table.json`` and ``table.md``;
  returns the JSON dict."""
  rows = []
  for task in args.tasks:
    for attention in args.attentions:
      group = os.path.join(root, f"{task}_{attention}")
      per = {s: [] for s in STAGES}
      seeds = []
      for seed in args.seeds:
        results = {}
        for stage in STAGES:
          path = os.path.join(group, f"seed{seed}", stage, "results.json")
          if os.path.exists(path):
            with open(path) as f:
              results[stage] = json.load(f)
        if all(s in results and results[s].get("complete") for s in STAGES):
          seeds.append(seed)
          for stage in STAGES:
            per[stage].append(results[stage])
      rows.append({
          "task": task, "attention": attention, "seeds": seeds,
          "scratch_test_final": [r["test_accuracy_final"] for r in per["scratch"]],
          "spt_ft_test_final": [r["test_accuracy_final"] for r in per["ft"]],
          "scratch_test_best_val": [r["test_accuracy_best_val"] for r in per["scratch"]],
          "spt_ft_test_best_val": [r["test_accuracy_best_val"] for r in per["ft"]],
          "spt_masked_token_val_accuracy": [r["best_val_accuracy"] for r in per["spt"]],
          "spt_masked_token_test_accuracy": [r["test_accuracy_final"] for r in per["spt"]]})
  command = " ".join(["python", "scripts/spt.py", *sys.argv[1:]])
  previous = os.path.join(root, "table.json")
  if getattr(args, "table_only", False) and os.path.exists(previous):
    with open(previous) as f:   # keep the training command(s) on record
      command = json.load(f)["command"] + "; tables rewritten by: " + command
  table = {"command": command,
           "size": args.size, "spt_steps": args.spt_steps, "ft_steps": args.ft_steps,
           "rows": rows}
  lines = ["| task | attention | seeds | scratch test acc (final) | SPT+FT test acc (final) "
           "| scratch (best val) | SPT+FT (best val) | SPT masked-token acc (test) |",
           "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['task']} | {r['attention']} | {','.join(map(str, r['seeds'])) or '-'} "
                 f"| {_mean_std(r['scratch_test_final'])} | {_mean_std(r['spt_ft_test_final'])} "
                 f"| {_mean_std(r['scratch_test_best_val'])} "
                 f"| {_mean_std(r['spt_ft_test_best_val'])} "
                 f"| {_mean_std(r['spt_masked_token_test_accuracy'])} |")
  with open(os.path.join(root, "table.json"), "w") as f:
    json.dump(table, f, indent=1)
  with open(os.path.join(root, "table.md"), "w") as f:
    f.write(f"Command: `{table['command']}`\n\n" + "\n".join(lines) + "\n")
  return table


def copy_out(root: str, dest: str) -> None:
  """Copies the tables and every run's ``config.json`` / ``results.json`` (never
  checkpoints) from ``root`` into ``dest``, keeping the folder layout."""
  for dirpath, _, files in os.walk(root):
    rel = os.path.relpath(dirpath, root)
    if "checkpoints" in rel.split(os.sep) or "best" in rel.split(os.sep):
      continue
    for name in files:
      if name in ("config.json", "results.json") or (
          rel == "." and name in ("table.md", "table.json")):
        os.makedirs(os.path.join(dest, rel), exist_ok=True)
        shutil.copy2(os.path.join(dirpath, name), os.path.join(dest, rel, name))


def main(argv=None) -> int:
  """Runs the grid (see the module docstring); returns 0."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--tasks", nargs="+", default=["listops", "text"])
  parser.add_argument("--attentions", nargs="+", default=["simple", "transformer", "linear"])
  parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
  parser.add_argument("--size", default="tiny", help="'tiny', or '' for the published size")
  parser.add_argument("--spt-steps", type=int, default=None,
                      help="pretraining steps (default: the :spt config's)")
  parser.add_argument("--ft-steps", type=int, default=None,
                      help="fine-tuning and scratch steps (default: the :spt_ft config's)")
  parser.add_argument("--warmup", type=int, default=None)
  parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
  parser.add_argument("--spt-set", action="append", default=[], metavar="FIELD=VALUE",
                      help="like --set, for the pretraining runs only (after --set)")
  parser.add_argument("--workdir-root", required=True)
  parser.add_argument("--copy-to", default="")
  parser.add_argument("--table-only", action="store_true",
                      help="train nothing: only (re)write the tables from the runs there are")
  args = parser.parse_args(argv)
  if args.table_only:
    write_table(args.workdir_root, args)
    if args.copy_to:
      copy_out(args.workdir_root, args.copy_to)
    return 0
  overrides, spt_overrides = parse_set(args.set), parse_set(args.spt_set)
  from simpletron_jax import train_lib  # pylint: disable=import-outside-toplevel
  os.makedirs(args.workdir_root, exist_ok=True)
  for seed in args.seeds:   # seed-major: a cut-short grid still has every cell's first seeds
    for task in args.tasks:
      for attention in args.attentions:
        base = os.path.join(args.workdir_root, f"{task}_{attention}", f"seed{seed}")
        for stage in STAGES:
          steps = args.spt_steps if stage == "spt" else args.ft_steps
          workdir = os.path.join(base, stage)
          init_from = os.path.join(base, "spt") if stage == "ft" else ""
          stage_overrides = {**overrides, **(spt_overrides if stage == "spt" else {})}
          config = stage_config(task, attention, args.size, stage, seed, steps, args.warmup,
                                stage_overrides, init_from)
          if run_done(workdir, config.num_train_steps):
            continue
          start = time.time()
          train_lib.train_and_evaluate(config, workdir)
          print(f"spt.py: {task} {attention} seed {seed} {stage}: {time.time() - start:.0f} s",
                file=sys.stderr, flush=True)
        write_table(args.workdir_root, args)
        if args.copy_to:
          copy_out(args.workdir_root, args.copy_to)
  return 0


if __name__ == "__main__":
  sys.exit(main())
