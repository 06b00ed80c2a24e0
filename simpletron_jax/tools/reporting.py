"""Reporting: per-seed summaries of runs and their comparison with published numbers.

Two protocols score a run (both are in every ``results.json``, see
:func:`simpletron_jax.train.trainer.train_and_evaluate`):

* ``best_val``: test accuracy of the best-validation checkpoint, the SimpleTRON
  authors' protocol (their notebooks keep the best-validation checkpoint; the paper
  gives the best of 5 seeds).
* ``final``: test accuracy of the parameters after the last step, LRA's protocol
  (``--test_only`` restores the latest checkpoint; LRA reports one run).

Accuracies are fractions in [0, 1] in ``results.json`` and percentages in the tables.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
from typing import Any, Iterable, Mapping

import numpy as np

from simpletron_jax.tools import published
from simpletron_jax.run import run_record, software_record

PROTOCOL_KEYS = {"best_val": "test_accuracy_best_val", "final": "test_accuracy_final"}
"""``results.json`` key of each protocol's test accuracy (a fraction)."""

_SEED_DIR = re.compile(r"^seed(\d+)$")


def last_error_line(text: str, program: str = "train.py") -> str | None:
  """The last ``<program>: <cause>`` line of a program's output (its one-line error, see
  :mod:`simpletron_jax.runtime.cli`), without the prefix; None when there is none."""
  prefix = f"{program}: "
  lines = [line.strip() for line in text.splitlines() if line.startswith(prefix)]
  return lines[-1][len(prefix):] if lines else None


def run_logged(cmd: list[str], cwd: str, log: str, what: str) -> None:
  """Runs ``cmd`` (a ``train.py`` command line) in ``cwd``, appending its stdout and stderr
  to the file ``log``.

  Raises:
    RuntimeError: if it exits non-zero; the message names ``what``, the exit code, the run's
      own one-line error when it printed one (``train.py: <cause>``, e.g. a config that
      differs from the checkpoint's, or a workdir locked by another run) and ``log``.
  """
  start = os.path.getsize(log) if os.path.exists(log) else 0
  with open(log, "a") as f:
    proc = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, check=False)
  if proc.returncode:
    with open(log, "rb") as f:   # this call's output only
      f.seek(start)
      cause = last_error_line(f.read().decode("utf-8", "replace"))
    raise RuntimeError(f"{what}: train.py exited {proc.returncode}"
                       + (f": {cause}" if cause else "") + f"; see {log}")


def protocol_accuracy(results: Mapping[str, Any], protocol: str) -> float:
  """The test accuracy (fraction) of one ``results.json`` under ``protocol``.

  Runs written before both protocols were recorded have only ``test_accuracy`` (the
  best-validation one); they have no ``final`` value.

  Raises:
    KeyError: for an unknown protocol, or ``final`` on such an older run.
  """
  key = PROTOCOL_KEYS[protocol]
  if key in results:
    return float(results[key])
  if protocol == "best_val":
    return float(results["test_accuracy"])
  raise KeyError(f"results.json has no {key!r} (written before the final-step protocol)")


def summarize_seeds(results_by_seed: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
  """Mean, sample std (ddof 1; 0 for one seed), best and worst per protocol, in percent.

  Args:
    results_by_seed: seed -> the contents of that seed's ``results.json``.

  Returns:
    ``{"seeds": [...], "per_seed": {seed: {protocol: %}}, "<protocol>": {"mean", "std",
    "best", "best_seed", "worst", "n"}}`` for each protocol every seed has.

  Raises:
    ValueError: if ``results_by_seed`` is empty.
  """
  if not results_by_seed:
    raise ValueError("no finished seeds to summarize")
  seeds = sorted(results_by_seed)
  summary: dict[str, Any] = {"seeds": seeds, "per_seed": {}}
  for protocol in PROTOCOL_KEYS:
    try:
      acc_S = np.array([100 * protocol_accuracy(results_by_seed[s], protocol) for s in seeds])
    except KeyError:
      continue
    summary[protocol] = {"mean": float(acc_S.mean()),
                         "std": float(acc_S.std(ddof=1)) if len(seeds) > 1 else 0.0,
                         "best": float(acc_S.max()), "best_seed": seeds[int(acc_S.argmax())],
                         "worst": float(acc_S.min()), "n": len(seeds)}
    for s, acc in zip(seeds, acc_S):
      summary["per_seed"].setdefault(s, {})[protocol] = float(acc)
  return summary


def summary_markdown(summary: Mapping[str, Any], title: str = "") -> str:
  """A markdown table of :func:`summarize_seeds`: one row per seed, then mean ± sample std,
  the best seed and the range (worst to best), in %."""
  protocols = [p for p in PROTOCOL_KEYS if p in summary]
  head = " | ".join(f"test acc. ({p}) %" for p in protocols)
  lines = ([f"### {title}", ""] if title else []) + [
      f"| seed | {head} |", "|---" * (len(protocols) + 1) + "|"]
  for seed in summary["seeds"]:
    cells = " | ".join(f"{summary['per_seed'][seed][p]:.2f}" for p in protocols)
    lines.append(f"| {seed} | {cells} |")
  lines.append("| mean ± std | " + " | ".join(
      f"{summary[p]['mean']:.2f} ± {summary[p]['std']:.2f}" for p in protocols) + " |")
  lines.append("| best (seed) | " + " | ".join(
      f"{summary[p]['best']:.2f} ({summary[p]['best_seed']})" for p in protocols) + " |")
  lines.append("| range | " + " | ".join(
      f"{summary[p]['worst']:.2f} to {summary[p]['best']:.2f}" for p in protocols) + " |")
  return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------
# Runs in a folder.


@dataclasses.dataclass
class RunGroup:
  """The seeds of one setting, found in a folder.

  Attributes:
    label: the folder of the seeds relative to the searched root (``seed<N>`` folders
      are grouped under their parent), or the run folder itself.
    task: ``config.task``.
    attention: ``config.model.attention``.
    results: seed -> ``results.json`` contents.
  """

  label: str
  task: str
  attention: str
  results: dict[int, dict[str, Any]]


def find_runs(root: str) -> list[RunGroup]:
  """Every run under ``root`` (a folder holding ``results.json`` and ``config.json``).

  Runs in folders named ``seed<N>`` are grouped by their parent folder; any other run
  is a group of its own, keyed by the ``seed`` of its config.

  Returns:
    The groups, sorted by label.

  Raises:
    FileNotFoundError: if ``root`` is not a folder or holds no run.
    ValueError: if one group mixes tasks or attentions (``file``: what differs).
  """
  if not os.path.isdir(root):
    raise FileNotFoundError(f"{root} is not a folder")
  groups: dict[str, RunGroup] = {}
  for folder, _, files in sorted(os.walk(root)):
    if not {"results.json", "config.json"} <= set(files):
      continue
    with open(os.path.join(folder, "config.json")) as f:
      config = json.load(f)
    with open(os.path.join(folder, "results.json")) as f:
      results = json.load(f)
    match = _SEED_DIR.match(os.path.basename(folder))
    group_dir = os.path.dirname(folder) if match else folder
    seed = int(match.group(1)) if match else int(config.get("seed", 0))
    label = os.path.relpath(group_dir, root)
    label = os.path.basename(os.path.abspath(root)) if label == "." else label
    task, attn = config["task"], config["model"]["attention"]
    group = groups.setdefault(label, RunGroup(label, task, attn, {}))
    if (group.task, group.attention) != (task, attn):
      raise ValueError(f"{folder}/config.json: task/attention {task}/{attn} differs from the "
                       f"other runs of {label} ({group.task}/{group.attention})")
    group.results[seed] = results
  if not groups:
    raise FileNotFoundError(f"no run (results.json + config.json) under {root}")
  return [groups[k] for k in sorted(groups)]


# ----------------------------------------------------------------------------
# Comparison with the published numbers.


COMPARED_FIELDS: dict[str, tuple[str, ...]] = {
    "size": ("model.emb_dim", "model.qkv_dim", "model.mlp_dim", "model.num_heads",
             "model.num_layers"),
    "length": ("model.max_length", "data.min_tokens", "data.max_tokens", "data.resolution"),
    "protocol": ("num_train_steps", "batch_size", "num_test_steps", "data.num_train",
                 "data.num_val", "data.num_test", "data.num_images", "data.level"),
}
"""The config fields (dotted, as in ``config.json``) that must equal those of a published
cell's config for a run's gap to that cell to be printed, by what they make: the model's
size, the length of its inputs (the longest sequence; ListOps' generated lengths;
Pathfinder's resolution), and the protocol (steps of the global batch, the whole test split,
the generated split sizes and difficulty). A field that neither config has is not compared;
one that only one of them has differs."""


def comparability_problem(config: Any, references: Mapping[str, Any]) -> str | None:
  """Why a run of ``config`` cannot be compared with a published number, or None when it can.

  Args:
    config: the run's config (``config.json``'s dict or a ``ConfigDict``).
    references: name -> a config the published number was obtained at (the paper-size
      configs of the run's task and attention: ``configs/lra.py``'s default, ``:authors``,
      ``:lra_code``); the run is comparable when it equals one of them in every field of
      :data:`COMPARED_FIELDS`.

  Returns:
    None, or one line naming what differs (``another size`` / ``length`` / ``protocol``)
    and the first fields that differ from the closest reference, ``<field> <ours> (published
    <theirs>)``; ``"no paper-size config to compare with"`` when ``references`` is empty.
  """
  if not references:
    return "no paper-size config to compare with"
  flat = run_record.flatten_config(config)
  closest: list[tuple[str, str, Any, Any]] | None = None
  for reference in references.values():
    ref = run_record.flatten_config(reference)
    differ = [(kind, field, flat.get(field, "not recorded"), ref.get(field, "not recorded"))
              for kind, fields in COMPARED_FIELDS.items() for field in fields
              if (field in flat or field in ref) and flat.get(field) != ref.get(field)]
    if not differ:
      return None
    if closest is None or len(differ) < len(closest):
      closest = differ
  kinds = list(dict.fromkeys(kind for kind, *_ in closest))
  what = (kinds[0] if len(kinds) == 1 else ", ".join(kinds[:-1]) + " and " + kinds[-1])
  shown = ", ".join(f"{field} {ours} (published {theirs})"
                    for _, field, ours, theirs in closest[:4])
  more = f", and {len(closest) - 4} more" if len(closest) > 4 else ""
  return f"another {what} than the published cell: {shown}{more}"


def comparison_rows(groups: Iterable[RunGroup],
                    problems: Mapping[str, str | None] | None = None) -> list[dict[str, Any]]:
  """One row per group: our numbers under both protocols and, where the group can be
  compared, the published number and the gap.

  ``ours`` is the statistic that matches how the published number was obtained
  (:data:`simpletron_jax.tools.published.PROTOCOLS`): the best seed of the best-validation
  checkpoints for the SimpleTRON paper, the mean of the final-step accuracies for LRA.
  ``gap`` is ``ours - published`` in points. A row without a gap has ``reason``, one line:
  ``problems[label]`` (a rehearsal, another size, length or protocol:
  :func:`comparability_problem`), nothing published for the attention on the task, or no
  accuracy under the publication's protocol.

  Args:
    groups: the runs, e.g. from :func:`find_runs`.
    problems: group label -> why it cannot be compared (None or missing: it can).
  """
  problems = problems or {}
  rows = []
  for g in groups:
    summary = summarize_seeds(g.results)
    entry = published.lookup(g.attention, g.task)
    row = {"label": g.label, "task": g.task, "attention": g.attention,
           "seeds": len(g.results), "summary": summary, "published": None,
           "source": None, "protocol": None, "ours": None, "gap": None,
           "reason": problems.get(g.label)}
    if row["reason"] is None and (entry is None or entry.accuracy is None):
      row["reason"] = (f"nothing published for `{g.attention}` on {g.task}" if entry is None
                       else f"{entry.source} published no accuracy ({entry.model}: FAIL)")
    if row["reason"] is None:
      protocol, statistic = published.PROTOCOLS[entry.source]
      if protocol in summary:
        ours = summary[protocol][statistic]
        row.update(published=entry.accuracy, source=entry.source, model=entry.model,
                   protocol=f"{protocol} {statistic}", ours=ours, gap=ours - entry.accuracy)
      else:
        row["reason"] = (f"no {protocol} test accuracy in its results.json, which "
                         f"{entry.source}'s protocol needs (written before it was recorded)")
    rows.append(row)
  return rows


def _pct(summary: Mapping[str, Any], protocol: str) -> str:
  if protocol not in summary:
    return "-"
  s = summary[protocol]
  return f"{s['mean']:.2f} ± {s['std']:.2f} / {s['best']:.2f}"


COMPARED_HEADING = "Against the published numbers (same size, length and protocol)"
NOT_COMPARED_HEADING = "Not compared with a published number"


def comparison_markdown(rows: Iterable[Mapping[str, Any]]) -> str:
  """The markdown of :func:`comparison_rows` (accuracies in %): under
  :data:`COMPARED_HEADING` the rows with a gap (or a line saying there are none); under
  :data:`NOT_COMPARED_HEADING`, if any, the rows without one, each with its ``reason``."""
  rows = list(rows)
  compared = [r for r in rows if r["gap"] is not None]
  other = [r for r in rows if r["gap"] is None]
  lines = [f"### {COMPARED_HEADING}", ""]
  if compared:
    lines += ["| run | task | attention | seeds | best-val: mean ± std / best | "
              "final: mean ± std / best | published (source) | ours, same protocol | gap |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in compared:
      lines.append(f"| {r['label']} | {r['task']} | `{r['attention']}` | {r['seeds']} | "
                   f"{_pct(r['summary'], 'best_val')} | {_pct(r['summary'], 'final')} | "
                   f"{r['published']:.2f} ({r['source']}) | {r['ours']:.2f} ({r['protocol']}) | "
                   f"{r['gap']:+.2f} |")
  else:
    lines.append("No run here is at a published cell's size, length and protocol, so no gap "
                 "is given.")
  if other:
    lines += ["", f"### {NOT_COMPARED_HEADING}", "",
              "| run | task | attention | seeds | best-val: mean ± std / best | "
              "final: mean ± std / best | why no gap |",
              "|---|---|---|---|---|---|---|"]
    for r in other:
      lines.append(f"| {r['label']} | {r['task']} | `{r['attention']}` | {r['seeds']} | "
                   f"{_pct(r['summary'], 'best_val')} | {_pct(r['summary'], 'final')} | "
                   f"{r['reason']} |")
  return "\n".join(lines) + "\n"


def software_markdown(groups: Iterable[RunGroup]) -> str:
  """What computed each group, from its runs' ``results.json``: one list item per group with
  each distinct :func:`software_record.software_line` and how many of its runs have it (``not
  recorded`` for runs written before train.py recorded its software)."""
  lines = []
  for g in groups:
    counts: dict[str, int] = {}
    for seed in sorted(g.results):
      line = software_record.software_line(g.results[seed])
      counts[line] = counts.get(line, 0) + 1
    shown = "; and ".join(f"{line} ({n} run{'' if n == 1 else 's'})"
                          for line, n in counts.items())
    lines.append(f"- {g.label}: {shown}")
  return "Software of each group (from its results.json):\n\n" + "\n".join(lines) + "\n"


def comparison_chart(rows: list[Mapping[str, Any]], path: str) -> None:
  """Writes a PNG bar chart: per run, both protocols (mean, std as error bar) and the
  published number where there is one.

  Args:
    rows: from :func:`comparison_rows`.
    path: the PNG file to write.
  """
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  x = np.arange(len(rows))
  fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(rows) + 2), 4.5))
  bars = (("best_val", "best-val checkpoint"), ("final", "final step"))
  for i, (protocol, name) in enumerate(bars):
    mean = [r["summary"].get(protocol, {}).get("mean", np.nan) for r in rows]
    std = [r["summary"].get(protocol, {}).get("std", 0.0) for r in rows]
    ax.bar(x + (i - 1) * 0.27, mean, 0.27, yerr=std, capsize=3, label=f"ours, {name} (mean)")
  pub = [np.nan if r["published"] is None else r["published"] for r in rows]
  ax.bar(x + 0.27, pub, 0.27, color="0.6", label="published")
  ax.set_xticks(x, [f"{r['label']}\n({r['task']})" for r in rows], fontsize=8)
  ax.set_xlim(-0.7, len(rows) - 0.3)
  ax.set_ylabel("test accuracy (%)")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
