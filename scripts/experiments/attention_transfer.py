"""SimpleTRON section 4.2, attention transfer: train a Simple model, move its q/k/v
projections into a softmax Transformer, freeze them, train the rest; compare the validation
curve with a softmax Transformer trained from scratch (the paper's Figure 2).

Per task, three runs share one recipe (the ``simple`` config of ``configs/``, so only the
attention and its ``attention_kwargs`` differ): ``simple`` (the source), ``softmax_scratch``
and ``softmax_transfer`` (``init_from`` the source, ``init_include`` and ``freeze`` the q/k/v
kernels (and biases, with model.attention_bias); the rest starts from a fresh initialisation).

    python scripts/experiments/attention_transfer.py --quick              # CPU, :tiny configs
    python scripts/experiments/attention_transfer.py                      # paper size

Writes ``attention_transfer.{json,md,png}`` to ``--out`` (default: the ``--runs`` folder,
``runs/experiments/attention_transfer/``); ``--copy_to DIR`` also copies them into ``DIR``
(``results/experiments/...`` to refresh the committed ones).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import exp_common  # noqa: E402  pylint: disable=wrong-import-position
from simpletron_jax.tools import reporting  # noqa: E402  pylint: disable=C0413

NAME = "attention_transfer"
QKV = ("attention/(query|key|value)/",)
# (steps, eval_every): --quick on CPU, and the paper size (the configs' own step counts).
QUICK = (300, 50)


def run_task(args, task: str, data_cache) -> dict:
  """The three runs on one task; returns their results and validation curves."""
  steps, every = QUICK if args.quick else (None, None)

  def config(attention, **fields):
    cfg = exp_common.make_config(args, task, "simple", steps, every, **fields)
    own = exp_common.lra.make_config(task, attention, "tiny" if args.quick else None)
    cfg.model.attention = attention
    cfg.model.attention_kwargs = own.model.attention_kwargs  # options of that attention
    return cfg

  root = os.path.join(args.runs, task)
  source_cfg = config("simple")
  data = data_cache(source_cfg)
  runs = {"simple": exp_common.train(source_cfg, os.path.join(root, "simple"), data)}
  runs["softmax_scratch"] = exp_common.train(config("softmax"),
                                             os.path.join(root, "softmax_scratch"), data)
  transfer_cfg = config("softmax", init_from=runs["simple"]["workdir"], init_include=QKV,
                        freeze=QKV)
  runs["softmax_transfer"] = exp_common.train(transfer_cfg,
                                              os.path.join(root, "softmax_transfer"), data)
  return runs


def steps_to_reach(curve, target: float) -> int | None:
  """The first step whose validation accuracy is at least ``target`` (None: never)."""
  return next((step for step, acc in curve if acc >= target), None)


def summarise(results: dict) -> str:
  """The markdown table: per task and run, best validation and test accuracy, and the
  first step at which the run reaches the scratch softmax model's best validation accuracy."""
  rows = []
  for task, runs in results.items():
    target = runs["softmax_scratch"]["best_val_accuracy"]
    for name, r in runs.items():
      rows.append([task, name, r["best_val_accuracy"],
                   reporting.protocol_accuracy(r, "best_val"), r["best_step"],
                   steps_to_reach(r["val_curve"], target) or "never"])
  return exp_common.markdown_table(
      ["task", "run", "best val acc.", "test acc. (best val)", "best step",
       "first step >= scratch softmax best val"], rows)


def plot(results: dict):
  """One panel per task: validation accuracy against step for the three runs."""
  def draw(fig):
    for i, (task, runs) in enumerate(results.items()):
      ax = fig.add_subplot(1, len(results), i + 1)
      for name, r in runs.items():
        steps, accs = zip(*r["val_curve"]) if r["val_curve"] else ((), ())
        ax.plot(steps, accs, marker="o", label=name)
      ax.set_title(f"{task}: attention transfer")
      ax.set_xlabel("step")
      ax.set_ylabel("validation accuracy")
      ax.legend()
  return draw


def main(argv=None, data=None) -> dict:
  """Runs the experiment; ``data`` (tests) replaces every task's data."""
  parser = exp_common.make_parser(NAME, __doc__)
  parser.add_argument("--tasks", nargs="+", default=["listops", "text"])
  args = parser.parse_args(argv)
  cache = exp_common.DataCache(data)
  results = {task: run_task(args, task, cache) for task in args.tasks}
  return exp_common.finish(args, NAME, {"results": results}, summarise(results), plot(results))


if __name__ == "__main__":
  exp_common.run_cli(main)
