"""Tabulates the runs in a folder against the published LRA and SimpleTRON numbers.

Usage::

    python scripts/compare.py results/listops_tiny_authors [--out DIR]

Every folder under the argument that holds ``results.json`` and ``config.json`` is a run;
``seed<N>`` folders are grouped by their parent (the layout ``scripts/seeds.py`` writes).
Only finished runs count: a ``results.json`` that is incomplete (``"complete": false``: a run
stopped by ``max_train_minutes``), computed at another step count or with another config than
the folder's ``config.json`` (``config_fingerprint``), resumed with ``--allow_resume_changes``
(``forced_resume_changes``: its numbers mix two configs; ``--count_forced`` counts it anyway),
or that holds a NaN, and a run folder without ``results.json``, are left out of the table and
listed under "Left out" with the reason (``run_record.results_problem``); the script then exits
with status 1.
For each group the table gives the test accuracy under both protocols (best-validation
checkpoint and final step: mean ± sample std / best seed), the published number for the
same attention and task (``simpletron_jax/tools/published.py``), our number under the protocol
the publication used, and the gap in points; under it, for context, the self-pretrained and
state-of-the-art rows of ``published.REFERENCES`` for the same tasks, and the software each
group was computed with (versions, devices, git commit; ``results.json``). Writes
``comparison.md`` and ``comparison.png`` (a bar chart; needs matplotlib, ``pip install -e
".[bench]"``; skip it with ``--no_plot``) in ``--out`` (default: the folder itself) and prints
the table. Without matplotlib the table is written, one line says how to get the chart, and
the exit status stays 0. The chart names each group's model size under its label (``:tiny``
for the CPU size of ``configs/<task>/<model>.py:tiny``, ``another size`` for any other size
than the published one): the published bars are for the paper's size only. Flags are spelled
with underscores; the dashed ``--no-plot`` and ``--count-forced`` are accepted until the next
release, with a note.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from simpletron_jax.data import tasks as task_registry  # noqa: E402  pylint: disable=C0413
from simpletron_jax.runtime import cli  # noqa: E402  pylint: disable=C0413
from simpletron_jax.tools import published, reporting  # noqa: E402  pylint: disable=C0413
from simpletron_jax.run import run_record  # noqa: E402  pylint: disable=C0413

SEED_DIR = re.compile(r"^seed(\d+)$")
# Folders a run writes that hold no run of their own (not searched).
RUN_SUBFOLDERS = ("checkpoints", "damaged", "tb")

NOTE = ("Published: LRA's Table 1 (one run, latest checkpoint) is compared with our mean "
        "final-step accuracy; the SimpleTRON paper (best of 5 seeds, best-validation "
        "checkpoint) with our best seed's best-validation accuracy. Gap = ours - published, "
        "in points. A published number was obtained at the paper's model size and length; "
        "a run of another size or length is not comparable with it.")


def _read_json(path: str):
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def collect_runs(root: str, count_forced: bool = False
                 ) -> tuple[list[reporting.RunGroup], list[str]]:
  """The finished runs under ``root``, grouped as :func:`reporting.find_runs` groups them,
  and one line for each run folder left out.

  A run folder is a ``seed<N>`` folder or one holding ``results.json`` or ``config.json``.
  It is left out when either file is missing or unreadable, or when
  :func:`run_record.results_problem` finds its ``results.json`` is not a finished run of its
  ``config.json`` (incomplete, another step count or config fingerprint, a NaN accuracy,
  changes forced by ``--allow_resume_changes`` unless ``count_forced``).

  Returns:
    ``(groups sorted by label, ["<folder relative to root>: <reason>", ...])``.

  Raises:
    FileNotFoundError: ``root`` is not a folder.
    ValueError: a group mixes tasks or attentions (naming the ``config.json``).
  """
  if not os.path.isdir(root):
    raise FileNotFoundError(f"{root} is not a folder")
  groups: dict[str, reporting.RunGroup] = {}
  left_out = []
  for folder, subfolders, files in sorted(os.walk(root)):
    subfolders[:] = sorted(d for d in subfolders if d not in RUN_SUBFOLDERS)
    match = SEED_DIR.match(os.path.basename(folder))
    if not (match or {"results.json", "config.json"} & set(files)):
      continue
    where = os.path.relpath(folder, root)
    missing = [name for name in ("results.json", "config.json") if name not in files]
    if missing:
      left_out.append(f"{where}: no {' and no '.join(missing)} (a run not finished, or "
                      "never started: resume it with train.py or scripts/seeds.py)")
      continue
    try:
      config = _read_json(os.path.join(folder, "config.json"))
      results = _read_json(os.path.join(folder, "results.json"))
    except (OSError, ValueError) as e:
      left_out.append(f"{where}: unreadable ({e})")
      continue
    problem = run_record.results_problem(results, config, count_forced)
    if problem is not None:
      left_out.append(f"{where}: results.json: {problem}")
      continue
    group_dir = os.path.dirname(folder) if match else folder
    seed = int(match.group(1)) if match else int(config.get("seed", 0))
    label = os.path.relpath(group_dir, root)
    label = os.path.basename(os.path.abspath(root)) if label == "." else label
    task, attn = config["task"], config["model"]["attention"]
    group = groups.setdefault(label, reporting.RunGroup(label, task, attn, {}))
    if (group.task, group.attention) != (task, attn):
      raise ValueError(f"{folder}/config.json: task/attention {task}/{attn} differs from the "
                       f"other runs of {label} ({group.task}/{group.attention})")
    group.results[seed] = results
  return [groups[k] for k in sorted(groups)], left_out


# The model fields that make a run's size (those :tiny changes).
SIZE_FIELDS = ("emb_dim", "qkv_dim", "mlp_dim", "num_heads", "num_layers", "max_length")


def model_size(task: str, attention: str, model: dict) -> str:
  """The size of a run's ``model`` section (``config.json``'s) against the configs of its
  task and attention (``configs/lra.py``): ``"paper size"`` (the published one), ``":tiny"``
  (the CPU size, ``configs/<task>/<model>.py:tiny``), ``"another size"``, or ``""`` when the
  configs cannot tell (a task or attention they do not know)."""
  try:
    from configs import lra  # pylint: disable=import-outside-toplevel
  except ImportError:
    return ""
  known = False
  for name, variant in (("paper size", None), (":tiny", "tiny")):
    try:
      reference = lra.make_config(task, attention, variant).model
    except Exception:  # pylint: disable=broad-except  (an unknown task, attention or variant)
      continue
    known = True
    if all(model.get(field) == reference.get(field) for field in SIZE_FIELDS):
      return name
  return "another size" if known else ""


def _group_config(root: str, group: reporting.RunGroup) -> dict:
  """The ``config.json`` of one run of ``group`` (found under ``root`` as
  :func:`collect_runs` labelled it); {} when none can be read."""
  folder = os.path.join(root, group.label)
  if not os.path.isdir(folder):
    folder = root   # the label of runs directly in root is root's own name
  names = ["config.json"] + [os.path.join(f"seed{seed}", "config.json") for seed in group.results]
  for name in names:
    try:
      return _read_json(os.path.join(folder, name))
    except (OSError, ValueError):
      continue
  return {}


def write_chart(rows, path: str, sizes: dict[str, str] | None = None) -> str | None:
  """:func:`reporting.comparison_chart` to ``path``, each group's label followed by its model
  size (``sizes``: label -> :func:`model_size`) where it is not the paper's; returns why not
  (one line) when matplotlib, an optional dependency (the ``bench`` and ``test`` extras), is
  missing."""
  try:
    import matplotlib  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    return (f"{path} not written: matplotlib is not installed; pip install -e \".[bench]\" "
            "for the chart, or pass --no_plot")
  sizes = sizes or {}
  shown = [{**row, "label": f"{row['label']}\n{sizes[row['label']]} run"}
           if sizes.get(row["label"], "paper size") != "paper size" else row for row in rows]
  reporting.comparison_chart(shown, path)
  return None


def sizes_markdown(sizes: dict[str, str]) -> str:
  """One line naming the groups that are not at the paper's size ("" when all are)."""
  other = {label: size for label, size in sizes.items() if size and size != "paper size"}
  if not other:
    return ""
  listed = "; ".join(f"{label}: {size}" for label, size in other.items())
  return (f"\nModel size: {listed}. These runs are smaller than the published models; their "
          "gap to a published number is not a reproduction result.\n")


def references_markdown(tasks: Sequence[str]) -> str:
  """For context under the table: the self-pretrained and state-of-the-art rows of
  :data:`simpletron_jax.tools.published.REFERENCES` on each of ``tasks`` (LRA task names; others
  are skipped), as a markdown list; "" when there are none. Not compared with our runs: they
  were trained with another recipe (SPT) or are other architectures."""
  unchecked = {r.model for r in published.REFERENCES if r.checked.startswith("NOT")}
  lines = [f"- {task}: " + "; ".join(
      f"{model} {accuracy:.2f}" + (" (unchecked)" if model in unchecked else "")
      for model, accuracy, _ in published.references(task))
           for task in dict.fromkeys(tasks) if task in task_registry.lra_tasks()]
  if not lines:
    return ""
  sources = "; ".join(f"{r.model}: {r.source} ({r.checked})" for r in published.REFERENCES)
  return ("\nFor context, not compared (self-pretrained or other architectures; test accuracy "
          "in %; how each row was checked is in its source line):\n\n"
          + "\n".join(lines)
          + f"\n\nSources: {sources}.\n")


def main(argv: Sequence[str] | None = None) -> str:
  """Parses the flags, writes comparison.md and comparison.png, returns the markdown.

  Raises:
    SystemExit: one line, after writing what it could: no folder or no finished run
      (status 1), run folders left out of the table (status 1, listed in the output). No
      matplotlib for the chart is not an error: one line on stderr says how to get it.
  """
  parser = cli.ArgumentParser(prog="compare.py", description=__doc__.split("\n\n")[0])
  parser.add_argument("folder", help="a folder of runs (searched recursively)")
  parser.add_argument("--out", default=None, help="output folder; default: the folder")
  parser.add_argument("--no_plot", action="store_true",
                      help="do not write comparison.png (which needs matplotlib)")
  parser.add_argument("--count_forced", action="store_true",
                      help="count runs resumed with train.py --allow_resume_changes, whose "
                      "numbers mix two configs (results.json's forced_resume_changes)")
  args = parser.parse_args(argv)
  try:
    groups, left_out = collect_runs(args.folder, args.count_forced)
  except (OSError, ValueError) as e:
    raise SystemExit(f"compare.py: {e}") from None
  if not groups:
    raise SystemExit(f"compare.py: no finished run (results.json + config.json) under "
                     f"{args.folder}" + "".join(f"; {line}" for line in left_out))
  rows = reporting.comparison_rows(groups)
  sizes = {}
  for group in groups:   # every seed of a group has one config; the first tells the size
    sizes[group.label] = model_size(group.task, group.attention,
                                    _group_config(args.folder, group).get("model", {}))
  out = args.out or args.folder
  os.makedirs(out, exist_ok=True)
  text = reporting.comparison_markdown(rows) + "\n" + NOTE + "\n" + sizes_markdown(sizes)
  text += "\n" + reporting.software_markdown(groups)
  text += references_markdown([group.task for group in groups])
  if left_out:
    text += "\nLeft out of the table:\n\n" + "".join(f"- {line}\n" for line in left_out)
  with open(os.path.join(out, "comparison.md"), "w", encoding="utf-8") as f:
    f.write(text)
  chart_problem = None if args.no_plot else write_chart(rows, os.path.join(out, "comparison.png"),
                                                        sizes)
  print(text)
  if left_out:
    done = f"{os.path.join(out, 'comparison.md')} written"
    why = f"{len(left_out)} run folder(s) left out of the table (listed above)"
    raise SystemExit("compare.py: " + "; ".join(x for x in (why, chart_problem, done) if x))
  if chart_problem:   # the table is the output; the chart is optional
    print(f"compare.py: {chart_problem}", file=sys.stderr)
  return text


if __name__ == "__main__":
  main()
