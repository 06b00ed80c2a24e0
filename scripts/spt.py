"""Self-pretraining then fine-tuning, against training from scratch, over tasks, attentions
and seeds (Amos et al., ICLR 2024; :mod:`simpletron_jax.train.pretraining`).

Usage::

    python scripts/spt.py --tasks listops text --attentions simple transformer linear \\
        --seeds 0 1 2 --size tiny --spt_steps 300 --ft_steps 300 \\
        --workdir_root runs/spt_tiny --copy_to results/spt_tiny

For each task, attention and seed, three runs in ``<root>/<task>_<attention>/seed<s>/``:

* ``spt``: ``configs/<task>/<attention>.py:<size>_spt`` (masked-token denoising on the
  training split) for ``--spt_steps`` steps;
* ``ft``: ``:<size>_spt_ft`` with ``init_from`` = the ``spt`` run (the encoder copied, the
  classifier head new) for ``--ft_steps`` steps;
* ``scratch``: ``:<size>`` for the same ``--ft_steps`` steps and the same schedule; at the
  paper size (``--size ''``) with the same recipe as ``ft`` too (the SPT code's fine-tuning
  optimisation, :func:`simpletron_jax.train.pretraining.apply_paper_recipe`), so the two arms
  differ only in their initialisation.

``--spt_steps`` / ``--ft_steps`` (optimizer steps) default to the configs' own: at the paper
size the SPT code's epochs and warmups, at ``tiny`` the ``tiny`` schedule.

``--table_only`` trains nothing and rewrites the tables from the runs found.
``--warmup`` (default 10% of each run's steps when its steps are given, else the config's)
and ``--config.<field>=<value>`` (the syntax of ``train.py``, parsed by
:mod:`simpletron_jax.runtime.overrides`; repeatable) apply to all three;
``--spt_config.<field>=<value>`` to the pretraining runs only (e.g. their learning rate), so
the two arms still fine-tune with the same recipe.
A run is not trained again when its ``results.json`` is a finished run of its very config:
complete, at its step count, and with its ``config_fingerprint``
(:func:`simpletron_jax.run.run_record.workdir_results_problem`, as ``scripts/seeds.py`` checks);
any other resumes from its checkpoints (the reason is printed). The runs go to
``--workdir_root`` (default ``runs/spt_<size>``). After each seed the script writes
``table.md`` and ``table.json`` in the root; nothing under ``results/`` changes unless
``--copy_to DIR`` is given, which copies them and every run's ``config.json`` and
``results.json`` (never checkpoints) into ``DIR``. The table gives the mean ± sample std over
the seeds done of the test accuracy at the final step (both arms have the same number of
fine-tuning steps) and at the best-validation step, and the pretraining's masked-token accuracy
on the validation split; only runs that count enter it (a fine-tuning run is compared with the
``init_from`` its own ``config.json`` names, so a copied folder still tabulates), and the others
are listed under ``left_out`` in ``table.json`` with the reason. Flags are spelled with
underscores, as train.py's; the dashed spellings (``--spt-steps``, ``--spt-config.<field>``,
...) are accepted until the next release, with a note.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from typing import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from simpletron_jax.runtime import cli  # noqa: E402  pylint: disable=C0413
from simpletron_jax.runtime import overrides as overrides_lib  # noqa: E402  pylint: disable=C0413
from simpletron_jax.run import run_record  # noqa: E402  pylint: disable=C0413

STAGES = ("spt", "ft", "scratch")
SPT_PREFIX = "--spt_config."
"""The prefix of the pretraining-only overrides (``--spt_config.<field>=<value>``)."""
OLD_SPT_PREFIX = "--spt-config."
"""Its former spelling, accepted until the next release (with a deprecation note)."""


def stage_config(task: str, attention: str, size: str, stage: str, seed: int,
                 steps: int | None, warmup: int | None, overrides: Sequence[str] = (),
                 init_from: str = ""):
  """The config of one run (``stage`` in :data:`STAGES`) from ``configs/<task>/<attention>.py``.

  ``steps`` (optimizer steps; None: the config's own) also sets the validation and
  checkpoint interval to one per run, and the warmup to 10% of it unless ``warmup`` is
  given. ``overrides`` (``--config.<field>=<value>`` strings) are applied after those, as
  ``train.py`` applies them (:func:`simpletron_jax.runtime.overrides.apply_overrides`).

  Raises:
    ValueError: an unknown task, attention or variant (from ``configs/lra.py``), or (one
      line) an override naming a field the config lacks or a value its type refuses.
  """
  import importlib  # pylint: disable=import-outside-toplevel
  module = importlib.import_module(f"configs.{task}.{attention}")
  variant = {"spt": f"{size}_spt", "ft": f"{size}_spt_ft", "scratch": size}[stage]
  variant = variant.lstrip("_") or None
  config = module.get_config(variant)
  if stage == "scratch" and not size:   # the paper size: the fine-tuning arm's recipe
    from simpletron_jax.train import pretraining  # pylint: disable=import-outside-toplevel
    pretraining.apply_paper_recipe(config, "ft")
  config.seed = seed
  if steps is not None:
    config.num_train_steps = steps
    config.warmup = max(1, steps // 10)
    config.eval_frequency = steps
    config.checkpoint_every = steps
  if warmup is not None:
    config.warmup = warmup
  overrides_lib.apply_overrides(config, overrides)
  if init_from:
    config.init_from = init_from
  return config


def run_problem(workdir: str, config) -> str | None:
  """Why ``workdir/results.json`` is not a finished run of ``config`` (missing, incomplete,
  another step count or config fingerprint), or None when it is
  (:func:`simpletron_jax.run.run_record.workdir_results_problem`)."""
  return run_record.workdir_results_problem(workdir, config)


def _saved_init_from(workdir: str) -> str | None:
  """The ``init_from`` of the run's own ``config.json``, or None."""
  saved = run_record.read_config_json(os.path.join(workdir, "config.json"))
  return saved.get("init_from") if saved else None


def _stage_overrides(args, stage: str) -> list[str]:
  """The ``--config.*`` overrides of one stage: every run's, then (``spt``) the pretraining's."""
  return list(args.config_overrides) + (list(args.spt_overrides) if stage == "spt" else [])


def run_config(args, task: str, attention: str, seed: int, stage: str, root: str):
  """The config of one run of the grid under ``root`` (``ft`` starts from the ``spt`` run)."""
  base = os.path.join(root, f"{task}_{attention}", f"seed{seed}")
  steps = args.spt_steps if stage == "spt" else args.ft_steps
  init_from = os.path.join(base, "spt") if stage == "ft" else ""
  return stage_config(task, attention, args.size, stage, seed, steps, args.warmup,
                      _stage_overrides(args, stage), init_from)


def _mean_std(values) -> str:
  if not values:
    return "-"
  if len(values) == 1:
    return f"{100 * values[0]:.1f}"
  return f"{100 * statistics.mean(values):.1f} ± {100 * statistics.stdev(values):.1f}"


def write_table(root: str, args) -> dict:
  """Collects every finished seed under ``root`` into ``table.json`` and ``table.md`` (a run
  counts when :func:`run_problem` finds nothing wrong with it for its config; a fine-tuning
  run is compared with the ``init_from`` of its own ``config.json``); returns the JSON dict,
  whose ``left_out`` lists the runs found that do not count, with the reason."""
  rows = []
  left_out = []
  for task in args.tasks:
    for attention in args.attentions:
      group = os.path.join(root, f"{task}_{attention}")
      per = {s: [] for s in STAGES}
      seeds = []
      for seed in args.seeds:
        results = {}
        for stage in STAGES:
          workdir = os.path.join(group, f"seed{seed}", stage)
          if not os.path.exists(os.path.join(workdir, "results.json")):
            continue
          config = run_config(args, task, attention, seed, stage, root)
          if stage == "ft" and _saved_init_from(workdir):
            config.init_from = _saved_init_from(workdir)
          problem = run_problem(workdir, config)
          if problem is not None:
            left_out.append(problem)
            continue
          with open(os.path.join(workdir, "results.json")) as f:
            results[stage] = json.load(f)
        if all(s in results for s in STAGES):
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
           "rows": rows, "left_out": left_out}
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
    if "checkpoints" in rel.split(os.sep):
      continue
    for name in files:
      if name in ("config.json", "results.json") or (
          rel == "." and name in ("table.md", "table.json")):
        os.makedirs(os.path.join(dest, rel), exist_ok=True)
        shutil.copy2(os.path.join(dirpath, name), os.path.join(dest, rel, name))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """The flags; ``config_overrides`` and ``spt_overrides`` hold the ``--config.*`` and
  ``--spt_config.*`` arguments (the latter as ``--config.*``).

  Raises:
    SystemExit: a bad invocation: one line, status 1 (cli.ArgumentParser.error).
  """
  parser = cli.ArgumentParser(
      prog="spt.py", description=__doc__.split("\n")[0],
      epilog="--config.<field>=<value> (repeatable) sets a config field of every run, as for "
             "train.py; --spt_config.<field>=<value> of the pretraining runs only (after "
             "--config.*)")
  parser.add_argument("--tasks", nargs="+", default=["listops", "text"])
  parser.add_argument("--attentions", nargs="+", default=["simple", "transformer", "linear"])
  parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
  parser.add_argument("--size", default="tiny", help="'tiny', or '' for the published size")
  parser.add_argument("--spt_steps", type=int, default=None,
                      help="pretraining steps (default: the :spt config's)")
  parser.add_argument("--ft_steps", type=int, default=None,
                      help="fine-tuning and scratch steps (default: the :spt_ft config's)")
  parser.add_argument("--warmup", type=int, default=None)
  parser.add_argument("--workdir_root", default=None,
                      help="folder of the runs and tables (default runs/spt_<size>)")
  parser.add_argument("--copy_to", default="", metavar="DIR",
                      help="also copy the tables and run files here, e.g. results/spt_tiny")
  parser.add_argument("--table_only", action="store_true",
                      help="train nothing: only (re)write the tables from the runs there are")
  argv = sys.argv[1:] if argv is None else list(argv)
  if any(a.startswith(OLD_SPT_PREFIX) for a in argv):
    print(f"spt.py: {OLD_SPT_PREFIX}<field> is deprecated: write {SPT_PREFIX}<field> (flags "
          "are spelled with underscores, as train.py's; the dashed form goes in the next "
          "release)", file=sys.stderr)
    argv = [SPT_PREFIX + a[len(OLD_SPT_PREFIX):] if a.startswith(OLD_SPT_PREFIX) else a
            for a in argv]
  hint = overrides_lib.old_syntax(argv, ("--set", "--spt-set"))
  if hint:
    parser.error(hint)
  try:
    rest, spt_overrides = overrides_lib.split_overrides(argv, SPT_PREFIX)
    rest, config_overrides = overrides_lib.split_overrides(rest)
  except ValueError as e:
    parser.error(str(e))
  args = parser.parse_args(rest)
  args.config_overrides, args.spt_overrides = config_overrides, spt_overrides
  if args.workdir_root is None:
    args.workdir_root = os.path.join(ROOT, "runs", f"spt_{args.size or 'paper'}")
  return args


def main(argv=None) -> int:
  """Runs the grid (see the module docstring); returns 0.

  Raises:
    ValueError: (one line) an override the configs refuse, before anything trains.
  """
  args = parse_args(argv)
  for stage in STAGES:   # a bad override stops here, before anything trains
    for task in args.tasks:
      for attention in args.attentions:
        run_config(args, task, attention, args.seeds[0], stage, args.workdir_root)
  if args.table_only:
    write_table(args.workdir_root, args)
    if args.copy_to:
      copy_out(args.workdir_root, args.copy_to)
    return 0
  from simpletron_jax.train import trainer  # pylint: disable=import-outside-toplevel
  os.makedirs(args.workdir_root, exist_ok=True)
  for seed in args.seeds:   # seed-major: a cut-short grid still has every cell's first seeds
    for task in args.tasks:
      for attention in args.attentions:
        base = os.path.join(args.workdir_root, f"{task}_{attention}", f"seed{seed}")
        for stage in STAGES:
          workdir = os.path.join(base, stage)
          config = run_config(args, task, attention, seed, stage, args.workdir_root)
          problem = run_problem(workdir, config)
          if problem is None:
            continue
          if problem != "no results.json":
            print(f"spt.py: {workdir} not reused: {problem}", file=sys.stderr, flush=True)
          start = time.time()
          trainer.train_and_evaluate(config, workdir)
          print(f"spt.py: {task} {attention} seed {seed} {stage}: {time.time() - start:.0f} s",
                file=sys.stderr, flush=True)
        write_table(args.workdir_root, args)
        if args.copy_to:
          copy_out(args.workdir_root, args.copy_to)
  return 0


if __name__ == "__main__":
  with cli.user_errors_exit("spt.py", dirs=(ROOT,)):
    sys.exit(main())
