"""Chan & Ong's linear-attention study: swap the attention of a trained softmax Transformer
(the study's Tables 6 to 8).

One softmax model is trained on text (IMDB). For each target attention (``linear``,
``performer``, ``simple``) the table has these rows:

* ``all`` / ``first k`` / ``last k`` layers swapped (``model.attention_per_layer``), the
  trained weights moved over (``transfer.transfer_params``), evaluated without retraining;
* ``LoRA r=32``: all layers swapped, then adapters of rank ``--lora_rank`` on W_q, W_k, W_v
  and W_o trained with the rest frozen (``config.lora``);
* ``full retraining``: all layers swapped, every parameter trained;
* ``unswapped``: the softmax model itself.

Re-alignment runs train ``--finetune_steps`` steps from the softmax run (``init_from``).

    python scripts/experiments/attention_swap.py --quick                  # CPU, :tiny config
    python scripts/experiments/attention_swap.py                          # paper size

Writes ``attention_swap.{json,md,png}`` to ``--out`` (default: the ``--runs`` folder,
``runs/experiments/attention_swap/``); ``--copy_to DIR`` also copies them into ``DIR``
(``results/experiments/...`` to refresh the committed ones).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import exp_common  # noqa: E402  pylint: disable=wrong-import-position
from simpletron_jax.tools import reporting  # noqa: E402  pylint: disable=C0413
# transfer and saved_runs import JAX: the functions that use them import them, so --help and a
# bad invocation end before JAX loads.

NAME = "attention_swap"
QUICK = {"steps": 600, "eval_every": 200, "finetune_steps": 200}
PAPER = {"steps": None, "eval_every": None, "finetune_steps": 2000}


def layer_lists(target: str, num_layers: int, k: int) -> dict[str, tuple[str, ...]]:
  """The per-layer attention lists of the no-retraining rows."""
  return {
      "all layers": (target,) * num_layers,
      f"first {k}": (target,) * k + ("softmax",) * (num_layers - k),
      f"last {k}": ("softmax",) * (num_layers - k) + (target,) * k,
  }


def swapped_accuracy(base_cfg, base_params, per_layer, data) -> tuple[float, dict]:
  """Test accuracy of the trained softmax weights in a model with ``per_layer`` attentions."""
  from simpletron_jax.model import transfer  # pylint: disable=import-outside-toplevel
  cfg = base_cfg.copy_and_resolve_references()
  cfg.model.attention_per_layer = tuple(per_layer)
  params, report = transfer.transfer_params(base_params, exp_common.init_params(cfg, data))
  metrics = exp_common.evaluate_params(cfg, params, data)
  return metrics["accuracy"], {"new": report.new, "dropped": report.dropped}


def run(args, data_cache) -> dict:
  """Trains the softmax model, evaluates the swaps, trains the re-alignments."""
  from simpletron_jax.train import saved_runs  # pylint: disable=import-outside-toplevel
  mode = QUICK if args.quick else PAPER
  base_cfg = exp_common.make_config(args, args.task, "softmax", mode["steps"],
                                    mode["eval_every"])
  data = data_cache(base_cfg)
  base = exp_common.train(base_cfg, os.path.join(args.runs, "softmax"), data)
  base_params = saved_runs.load_run(base["workdir"]).params()
  unswapped = exp_common.evaluate_params(base_cfg, base_params, data)["accuracy"]
  n_layers = base_cfg.model.num_layers
  k = args.k or max(n_layers // 2, 1)
  ft_steps = args.finetune_steps or mode["finetune_steps"]
  table, surgery = {}, {}
  for target in args.targets:
    rows = {}
    for row, per_layer in layer_lists(target, n_layers, k).items():
      rows[row], surgery[f"{target}/{row}"] = swapped_accuracy(base_cfg, base_params,
                                                               per_layer, data)
    for row, fields in ((f"LoRA r={args.lora_rank}", {"lora__rank": args.lora_rank}),
                        ("full retraining", {})):
      cfg = exp_common.make_config(
          args, args.task, "softmax", model__attention_per_layer=(target,) * n_layers,
          init_from=base["workdir"], **fields)
      exp_common.set_length(cfg, ft_steps, min(cfg.eval_frequency, ft_steps))
      workdir = os.path.join(args.runs, f"{target}_{'lora' if fields else 'retrain'}")
      rows[row] = reporting.protocol_accuracy(exp_common.train(cfg, workdir, data), "best_val")
    rows["unswapped"] = unswapped
    table[target] = rows
  return {"base": base, "table": table, "surgery": surgery, "k": k,
          "finetune_steps": ft_steps, "lora_rank": args.lora_rank}


def summarise(result: dict) -> str:
  """Rows (swap settings) by columns (target attentions) of test accuracy."""
  targets = list(result["table"])
  rows = [[row] + [result["table"][t][row] for t in targets]
          for row in result["table"][targets[0]]]
  return exp_common.markdown_table(["softmax model, attention swapped to"] + targets, rows)


def plot(result: dict):
  """Grouped bars: test accuracy per row, one group per target attention."""
  def draw(fig):
    ax = fig.add_subplot(1, 1, 1)
    targets = list(result["table"])
    rows = list(result["table"][targets[0]])
    width = 0.8 / len(rows)
    for j, row in enumerate(rows):
      ax.bar([i + j * width for i in range(len(targets))],
             [result["table"][t][row] for t in targets], width, label=row)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(targets))], targets)
    ax.set_ylabel("test accuracy")
    ax.set_title("attention swap of a trained softmax model")
    ax.legend(fontsize=8)
  return draw


def main(argv=None, data=None) -> dict:
  """Runs the experiment; ``data`` (tests) replaces the task's data."""
  parser = exp_common.make_parser(NAME, __doc__)
  parser.add_argument("--task", default="text")
  parser.add_argument("--targets", nargs="+", default=["linear", "performer", "simple"])
  parser.add_argument("--k", type=int, default=0,
                      help="layers in the first-k / last-k rows (default: half)")
  parser.add_argument("--lora_rank", type=int, default=32)
  parser.add_argument("--finetune_steps", type=int, default=0,
                      help="steps of the LoRA and retraining runs (default: the mode's)")
  args = parser.parse_args(argv)
  result = run(args, exp_common.DataCache(data))
  return exp_common.finish(args, NAME, result, summarise(result), plot(result), task=args.task)


if __name__ == "__main__":
  exp_common.run_cli(main)
