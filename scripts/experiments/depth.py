"""SimpleTRON section 5.2 and Table 2: accuracy against depth for ``softmax``, ``simple`` and
``simple_res``, with several seeds, and the spread and symmetry of each block's attention
output weights (the paper's Figure 5).

The "attention output weights" of a block are measured here as the per-head ``K^T V / L``
matrices (``[K, K]``, the matrix Simple's queries multiply) on one validation batch, pads
left out, averaged over the batch; every attention has the q/k/v projections, so softmax gets
the same measurement for comparison. Per block the script reports their spread (standard
deviation of the entries, averaged over heads) and symmetry
``(|S|^2 - |A|^2) / |M|^2`` with ``S``, ``A`` the symmetric and antisymmetric parts
(1: symmetric, 0: as much antisymmetric as symmetric, -1: antisymmetric).

Every seed changes the initialisation and the data order; the data itself is the seed-0 data
(``data.seed = 0``), so ListOps is generated once.

    python scripts/experiments/depth.py --quick                           # CPU: 1, 2, 4, 8 blocks
    python scripts/experiments/depth.py                                   # paper size: 1 to 12

``--task agnews`` is the paper's Table 2 (section 5.3): AG News with BERT's encoder from
scratch, ``softmax`` (BERT) against ``simple_resl`` (SimpleTRON) by default; it needs the data
and a BERT vocabulary (``docs/bert.md``)::

    python scripts/experiments/depth.py --task agnews --seeds 0 \
        --config.data.data_dir=~/data/ag_news_csv --config.data.vocab_path=~/bert-base-cased

Writes ``depth.{json,md,png}`` to ``--out`` (default: the ``--runs`` folder,
``runs/experiments/depth/``); ``--copy_to DIR`` also copies them into ``DIR``
(``results/experiments/...`` to refresh the committed ones).
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import exp_common  # noqa: E402  pylint: disable=wrong-import-position
from simpletron_jax.tools import reporting  # noqa: E402  pylint: disable=C0413
# The training modules (saved_runs, train_state, batches) import JAX: the functions that use
# them import them, so --help and a bad invocation end before JAX loads.

NAME = "depth"
QUICK = {"steps": 300, "eval_every": 100, "depths": [1, 2, 4, 8]}
PAPER = {"steps": None, "eval_every": None, "depths": list(range(1, 13))}
# The attentions compared by task (None: any task without an entry): section 5.2's three, and
# Table 2's BERT and SimpleTRON (Simple-ResL) on AG News.
DEFAULT_ATTENTIONS = {None: ["softmax", "simple", "simple_res"],
                      "agnews": ["softmax", "simple_resl"]}


def kv_matrices(config, params, data) -> list[np.ndarray]:
  """Per block, the batch-mean ``K^T V / L`` per head, ``[H, K, K]``, on a validation batch.

  ``L`` is each example's number of real tokens (CLS included), as in Simple attention.
  """
  from simpletron_jax.data import batches  # pylint: disable=import-outside-toplevel
  from simpletron_jax.train import run_config, train_state  # pylint: disable=C0415
  model = train_state.build_model(run_config.RunConfig.from_config_dict(config), data)
  batch = next(batches.eval_batches(data.val, batches.BatchConfig.from_config_dict(config), 32, 1))
  want = lambda mdl, _: mdl.name in ("key", "value")  # noqa: E731
  _, state = model.apply({"params": params}, batch["inputs"], batch["mask"],
                         capture_intermediates=want, mutable=["intermediates"])
  mask = np.asarray(batch["mask"], np.float32)
  # A CLS vector is prepended under CLS pooling, except with BERT's embeddings, whose [CLS]
  # is the first token of the input.
  if (config.model.classifier_pool == "CLS"
      and config.model.get("embedding_type", "lra") != "bert"):
    mask = np.concatenate([np.ones_like(mask[:, :1]), mask], axis=1)
  out = []
  for i in range(config.model.num_layers):
    att = state["intermediates"]["encoder"][f"encoderblock_{i}"]["attention"]
    k_BxLxHxK = np.asarray(att["key"]["__call__"][0]) * mask[:, :, None, None]
    v_BxLxHxK = np.asarray(att["value"]["__call__"][0]) * mask[:, :, None, None]
    m_BxHxKxK = np.einsum("blhk,blhd->bhkd", k_BxLxHxK, v_BxLxHxK)
    m_BxHxKxK /= mask.sum(1)[:, None, None, None]
    out.append(m_BxHxKxK.mean(0))
  return out


def symmetry(m_KxK: np.ndarray) -> float:
  """``(|S|^2 - |A|^2) / |M|^2``, S and A the symmetric and antisymmetric parts of M."""
  sym, anti = (m_KxK + m_KxK.T) / 2, (m_KxK - m_KxK.T) / 2
  return float((np.sum(sym ** 2) - np.sum(anti ** 2)) / max(np.sum(m_KxK ** 2), 1e-30))


def block_stats(config, workdir, data) -> list[dict[str, float]]:
  """Spread and symmetry of each block's ``K^T V`` of a run's best checkpoint."""
  from simpletron_jax.train import saved_runs  # pylint: disable=import-outside-toplevel
  params = saved_runs.load_run(workdir).params()
  stats = []
  for m_HxKxK in kv_matrices(config, params, data):
    stats.append({"spread": float(np.mean([h.std() for h in m_HxKxK])),
                  "symmetry": float(np.mean([symmetry(h) for h in m_HxKxK]))})
  return stats


def run(args, data_cache) -> dict:
  """Trains every (attention, depth, seed) and collects test accuracy and block stats.

  With ``--finished_only`` the unfinished runs are left out instead of trained.

  Raises:
    ValueError: with ``--finished_only``, if no run has finished.
  """
  mode = QUICK if args.quick else PAPER
  runs = []
  attentions = args.attentions or DEFAULT_ATTENTIONS.get(args.task, DEFAULT_ATTENTIONS[None])
  for attention in attentions:
    for depth in args.depths or mode["depths"]:
      for seed in args.seeds:
        cfg = exp_common.make_config(args, args.task, attention, mode["steps"],
                                     mode["eval_every"], model__num_layers=depth)
        cfg = cfg.copy_and_resolve_references()  # data.seed stops following seed
        cfg.seed, cfg.data.seed = seed, 0
        workdir = os.path.join(args.runs, f"{attention}_L{depth}_seed{seed}")
        if args.finished_only and not exp_common.finished(workdir, cfg):
          continue
        data = data_cache(cfg)
        result = exp_common.train(cfg, workdir, data)
        runs.append({"attention": attention, "num_layers": depth, "seed": seed,
                     "test_accuracy": reporting.protocol_accuracy(result, "best_val"),
                     "best_val_accuracy": result["best_val_accuracy"],
                     "blocks": block_stats(cfg, workdir, data)})
  if not runs:
    raise ValueError(f"no finished run under {args.runs} (--finished_only)")
  return {"runs": runs, "summary": summary(runs)}


def summary(runs: list[dict]) -> list[dict]:
  """Mean and std over seeds of test accuracy, and of the deepest block's stats."""
  groups: dict[tuple[str, int], list[dict]] = {}
  for r in runs:
    groups.setdefault((r["attention"], r["num_layers"]), []).append(r)
  rows = []
  for (attention, depth), group in groups.items():
    acc = [r["test_accuracy"] for r in group]
    sym = [r["blocks"][-1]["symmetry"] for r in group]
    spread = [r["blocks"][-1]["spread"] for r in group]
    rows.append({"attention": attention, "num_layers": depth, "seeds": len(group),
                 "test_mean": float(np.mean(acc)), "test_std": float(np.std(acc)),
                 "last_block_symmetry": float(np.mean(sym)),
                 "last_block_spread": float(np.mean(spread))})
  return rows


def table(result: dict) -> str:
  """The markdown table of :func:`summary`."""
  rows = [[s["attention"], s["num_layers"], s["seeds"],
           f"{100 * s['test_mean']:.1f} ± {100 * s['test_std']:.1f}",
           s["last_block_symmetry"], s["last_block_spread"]] for s in result["summary"]]
  return exp_common.markdown_table(
      ["attention", "blocks", "seeds", "test acc. % (mean ± std)",
       "last block K^T V symmetry", "last block K^T V spread"], rows)


def plot(result: dict):
  """Left: test accuracy against depth (mean ± std). Right: per-block symmetry of the
  deepest models (mean over seeds)."""
  def draw(fig):
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for attention in dict.fromkeys(s["attention"] for s in result["summary"]):
      rows = [s for s in result["summary"] if s["attention"] == attention]
      left.errorbar([s["num_layers"] for s in rows], [s["test_mean"] for s in rows],
                    yerr=[s["test_std"] for s in rows], marker="o", capsize=3, label=attention)
      deepest = max(s["num_layers"] for s in rows)
      blocks = [r["blocks"] for r in result["runs"]
                if r["attention"] == attention and r["num_layers"] == deepest]
      sym = np.mean([[b["symmetry"] for b in bl] for bl in blocks], axis=0)
      right.plot(range(1, deepest + 1), sym, marker="o", label=f"{attention}, {deepest} blocks")
    left.set(xlabel="blocks", ylabel="test accuracy", title="accuracy against depth")
    right.set(xlabel="block", ylabel="K^T V symmetry", title="symmetry per block")
    left.legend()
    right.legend()
  return draw


def main(argv=None, data=None) -> dict:
  """Runs the experiment; ``data`` (tests) replaces the task's data."""
  parser = exp_common.make_parser(NAME, __doc__)
  parser.add_argument("--task", default="listops",
                      help="listops (section 5.2) or agnews (Table 2); any task of configs/")
  parser.add_argument("--attentions", nargs="+", default=None,
                      help="default: softmax simple simple_res; with --task agnews: softmax "
                           "simple_resl")
  parser.add_argument("--depths", nargs="+", type=int, default=None,
                      help="numbers of blocks (default: 1 2 4 8 quick, 1..12 paper)")
  parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
  parser.add_argument("--finished_only", action="store_true",
                      help="train nothing: report the runs under --runs that have finished "
                           "(a grid that is still running, or was stopped)")
  args = parser.parse_args(argv)
  result = run(args, exp_common.DataCache(data))
  return exp_common.finish(args, NAME, result, table(result), plot(result), task=args.task)


if __name__ == "__main__":
  exp_common.run_cli(main)
