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
A group gets a gap to its published number (``simpletron_jax/tools/published.py``) only when
its runs were made at that cell's model size, input length and protocol: its ``config.json``
equals one of the cell's paper-size configs (``configs/lra.py``: the default, ``:authors`` or
``:lra_code``) in every field of ``reporting.COMPARED_FIELDS``. Those groups make the first
table: the test accuracy under both protocols (best-validation checkpoint and final step:
mean ± sample std / best seed), the published number, ours under the protocol the
publication used, and the gap in points. Every other group (a ``reproduce.py --rehearse``
run, whose ``reproduce.json`` says so; a ``:tiny`` or other size; another length, step count
or test split; nothing published for its attention and task) is listed in a second table,
without a published number or gap, with the reason on its row; such a group is not an error.
Under the tables, for context, the self-pretrained and state-of-the-art rows of
``published.REFERENCES`` for the same tasks, and the software each group was computed with
(versions, devices, git commit; ``results.json``). Writes ``comparison.md`` and
``comparison.png`` (a bar chart; needs matplotlib, ``pip install -e ".[bench]"``; skip it with
``--no_plot``) in ``--out`` (default: the folder itself) and prints the tables. Without
matplotlib the tables are written, one line says how to get the chart, and the exit status
stays 0. In the chart a group without a gap has ``no gap: <why>`` under its label and no
published bar. Flags are spelled
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
        "in points, given only for a run at the published cell's model size, input length "
        "and protocol (training steps and batch, the whole test split); any other run is "
        "listed apart, with the reason.")


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


REHEARSAL_FILE = "reproduce.json"   # scripts/reproduce.py's record, "rehearsal": true


def paper_configs(task: str, attention: str) -> dict[str, dict]:
  """The configs a published number of ``attention`` on ``task`` was obtained at:
  ``configs/lra.py``'s paper size (no variant) and, where the pair has them, its ``:authors``
  and ``:lra_code`` variants (the same sizes, with the authors' or LRA's function), as
  ``config.json``-like dicts; {} for a task or attention the configs do not know."""
  try:
    from configs import lra  # pylint: disable=import-outside-toplevel
    known = lra.variants(task, attention)
  except Exception:  # pylint: disable=broad-except  (an unknown task or attention)
    return {}
  return {f":{variant}" if variant else "paper size":
          lra.make_config(task, attention, variant).to_dict()
          for variant in (None, "authors", "lra_code") if variant is None or variant in known}


def tiny_size(task: str, attention: str, config: dict) -> bool:
  """Whether ``config`` (a ``config.json`` dict) has the model size and input length of
  ``configs/<task>/<model>.py:tiny``, the CPU size (:data:`reporting.COMPARED_FIELDS`)."""
  try:
    from configs import lra  # pylint: disable=import-outside-toplevel
    tiny = run_record.flatten_config(lra.make_config(task, attention, "tiny"))
  except Exception:  # pylint: disable=broad-except  (an unknown task or attention)
    return False
  flat = run_record.flatten_config(config)
  return all(flat.get(field) == tiny.get(field)
             for field in reporting.COMPARED_FIELDS["size"] + reporting.COMPARED_FIELDS["length"])


def group_problem(root: str, group: reporting.RunGroup) -> str | None:
  """Why ``group`` (found under ``root``) gets no gap to a published number, or None: a
  rehearsal (``reproduce.py --rehearse``: its ``reproduce.json`` says so), a run whose
  ``config.json`` is not at a published cell's size, length and protocol
  (:func:`reporting.comparability_problem` against :func:`paper_configs`), or one whose
  ``config.json`` cannot be read. Every seed of a group has one config; the first is read."""
  folder = os.path.join(root, group.label)
  if not os.path.isdir(folder):
    folder = root   # the label of runs directly in root is root's own name
  runs = [folder] + [os.path.join(folder, f"seed{seed}") for seed in sorted(group.results)]
  for run in runs:
    try:
      if _read_json(os.path.join(run, REHEARSAL_FILE)).get("rehearsal"):
        return ("a rehearsal (reproduce.py --rehearse: the :tiny size for a few steps on a few "
                "examples), not a result")
    except (OSError, ValueError, AttributeError):
      pass
  config = None
  for run in runs:
    try:
      config = _read_json(os.path.join(run, "config.json"))
      break
    except (OSError, ValueError):
      continue
  if config is None:
    return "its config.json cannot be read"
  problem = reporting.comparability_problem(config, paper_configs(group.task, group.attention))
  if problem is not None and tiny_size(group.task, group.attention, config):
    problem = f"the :tiny size (configs/{group.task}/<model>.py:tiny); {problem}"
  return problem


def short_reason(reason: str) -> str:
  """A few words of a row's ``reason`` for the chart: ``rehearsal``, ``:tiny size``,
  ``another size`` (``length``, ``protocol``, ...), ``nothing published``, or its first 30
  characters."""
  for start, short in (("a rehearsal", "rehearsal"), ("the :tiny size", ":tiny size"),
                       ("nothing published", "nothing published")):
    if reason.startswith(start):
      return short
  if " than the published cell" in reason:
    return reason.split(" than the published cell")[0]
  return reason[:30]


def write_chart(rows, path: str) -> str | None:
  """:func:`reporting.comparison_chart` to ``path``, the label of each row without a gap
  followed by ``no gap: <a few words>`` (:func:`short_reason`; no published bar is drawn); returns
  why not (one line) when matplotlib, an optional dependency (the ``bench`` and ``test``
  extras), is missing."""
  try:
    import matplotlib  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    return (f"{path} not written: matplotlib is not installed; pip install -e \".[bench]\" "
            "for the chart, or pass --no_plot")
  shown = [row if row["gap"] is not None else
           {**row, "label": f"{row['label']}\nno gap: {short_reason(row['reason'])}"}
           for row in rows]
  reporting.comparison_chart(shown, path)
  return None


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
  rows = reporting.comparison_rows(
      groups, {group.label: group_problem(args.folder, group) for group in groups})
  out = args.out or args.folder
  os.makedirs(out, exist_ok=True)
  text = reporting.comparison_markdown(rows) + "\n" + NOTE + "\n"
  text += "\n" + reporting.software_markdown(groups)
  text += references_markdown([group.task for group in groups])
  if left_out:
    text += "\nLeft out of the table:\n\n" + "".join(f"- {line}\n" for line in left_out)
  with open(os.path.join(out, "comparison.md"), "w", encoding="utf-8") as f:
    f.write(text)
  chart_problem = None if args.no_plot else write_chart(rows, os.path.join(out, "comparison.png"))
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
