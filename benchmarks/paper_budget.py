"""Device minutes of each paper cell on an H100, modelled from the committed H100 figures.

    python benchmarks/paper_budget.py --out runs/benchmarks/paper_budget

For every cell of ``scripts/reproduce.py`` the config is built exactly as the cell's command
builds it, and the analytic FLOPs (``benchmarks/flops.py``: every matrix product of the
jaxpr) of one train step and of one eval batch are counted at the cell's global batch and
full width (``max_length`` + CLS; a batch of 32 from LRA's length distributions is nearly
always at full width, and the cells train with fixed widths). A step takes the longest of
three times, each calibrated on a measurement of the H100 in bfloat16
(``benchmarks/results/nvidia-h100-80gb-hbm3/``: the LRA text model, batch 32):

* **matmuls**: FLOPs / the rate a train step reached: softmax (einsum) 56.9 TFLOP/s at 1K
  and 46.1 at 4K, simple 79.8 at 1K, 85.2 at 4K and 91.2 at 16K; between two measured
  lengths the rate is interpolated in log2(length), outside it is the nearest one's. Linear
  and Performer take simple's rate (the same matmul shapes, never measured on a GPU);
* **softmax scores** (einsum softmax only): 22.9 ps per score element and layer
  (``B x H x L^2`` elements, the CLS-only last block not counted), the time of the softmax
  step at 4K, where the scores dominate (197 ms for 8.6e9 elements);
* **activations**: 31.9 ps per ``B x L x (emb_dim + mlp_dim)`` element and layer, the
  non-matmul kernel time of the simple step at 4K (77.6% of 27.55 ms in its profile,
  ``profile_simple_4k_bf16.txt``, for 6.7e8 elements).

An eval batch takes the same three times with its forward FLOPs and a third of the other two
(a forward pass is about a third of a train step). Then:

* **train** = steps x step time; **evaluation** = (validations x val batches + 2 x test
  batches) x eval batch time (the test runs twice, on the best-validation and the final
  parameters);
* **compile** = 2 programs (train and eval) x 27 s, the slowest train-step compile measured
  on the H100 (``compile_s`` of the records: 9 to 27 s);
* **start** = 60 s for the wheels, imports, data and the first checkpoint (an allowance: the
  first GPU call will measure it).

The model is a first estimate, not a timing; the first GPU call of each cell measures its
steps/s (``results.json``), which then replaces the modelled figure in docs/reproduce.md.

Writes ``paper_budget.json`` (every number) and ``paper_budget.md`` (the table) to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import jax  # noqa: E402

import flops  # noqa: E402
import reproduce  # noqa: E402
from simpletron_jax.data import batches  # noqa: E402
from simpletron_jax.model import encoders  # noqa: E402
from simpletron_jax.tools import tpu_aot  # noqa: E402
from simpletron_jax.train import steps, trainer  # noqa: E402

# Achieved matmul TFLOP/s of a bfloat16 train step on the H100, by attention and length
# (speed_memory_core_cells.jsonl and speed_memory_4k_16k.json there).
H100_RATES = {"softmax": {1024: 56.9, 4096: 46.1},
              "simple": {1024: 79.8, 4096: 85.2, 16384: 91.2}}
RATE_SOURCE = {"softmax": "softmax", "simple": "simple", "simple_res": "simple",
               "simple_resl": "simple", "linear": "simple", "performer": "simple"}
SCORE_S = 0.197 / (32 * 4 * 4097 ** 2 * 4)   # softmax at 4K: s per score element and layer
ACTIVATION_S = 0.776 * 27.55e-3 / (32 * 4097 * (256 + 1024) * 4)  # simple at 4K, non-matmul
COMPILE_S = 27.0   # the slowest train-step compile measured on the H100 (softmax at 1K)
START_S = 60.0     # an allowance, not measured
# Examples per split at the paper's sizes (docs/data.md): ListOps 2,000 / 2,000; IMDB test
# 25,000 and 2,500 held out of train (LRA's code validates on the test split); CIFAR-10 5,000
# held out and 10,000 test; Pathfinder-32 10% of 200,000 each.
SPLITS = {"listops": (2000, 2000), "text": (2500, 25000), "image": (5000, 10000),
          "pathfinder": (20000, 20000)}
CALL_LIMIT_MIN = 9.0   # one prepared device call (DEVELOPERS.md: at most 9 minutes)


def rate_tflops(attention: str, length: int) -> tuple[float, str]:
  """The modelled TFLOP/s of ``attention`` at ``length`` tokens, and how it was obtained."""
  source = RATE_SOURCE[attention]
  table = H100_RATES[source]
  points = sorted(table)
  if length <= points[0] or length >= points[-1]:
    nearest = points[0] if length <= points[0] else points[-1]
    return table[nearest], f"{source} at {nearest}"
  lo = max(p for p in points if p <= length)
  hi = min(p for p in points if p > length)
  t = (math.log2(length) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
  return table[lo] + t * (table[hi] - table[lo]), f"{source}, {lo} to {hi} interpolated"


@dataclasses.dataclass
class Budget:
  """One cell's modelled device time (seconds) and what it was computed from."""

  cell: str
  width: int
  batch: int
  steps: int
  validations: int
  val_batches: int
  test_batches: int
  train_tflop: float
  eval_tflop: float
  rate_tflops: float
  rate_source: str
  bound: str
  steps_per_sec: float
  train_s: float
  eval_s: float
  compile_s: float
  start_s: float

  @property
  def total_min(self) -> float:
    """All of it, in minutes."""
    return (self.train_s + self.eval_s + self.compile_s + self.start_s) / 60.0


def cell_budget(cell: reproduce.Cell) -> Budget:
  """Counts the cell's FLOPs on this machine (abstractly, nothing runs) and models its time."""
  config = reproduce.cell_config(cell)
  vocab, classes, dual = tpu_aot.task_sizes(config)
  model = encoders.build_classifier(config.model, vocab_size=vocab, num_classes=classes,
                                    dual=dual)
  width = config.model.max_length
  batch = config.batch_size
  eval_batch = config.eval_batch_size or batches.micro_batch_size(config)
  state = jax.eval_shape(lambda r: trainer.create_train_state(config, model, r),
                         jax.random.PRNGKey(0))
  state = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct((1, *x.shape), x.dtype), state)
  p_train, p_eval = steps.pmap_steps(model.apply, devices=jax.local_devices()[:1])
  train = flops.function_flops(p_train, state, tpu_aot.abstract_batch(1, batch, width, dual),
                               jax.random.PRNGKey(1)).total
  evalf = flops.function_flops(p_eval, state.params,
                               tpu_aot.abstract_batch(1, eval_batch, width, dual)).total
  rate, source = rate_tflops(config.model.attention, width + 1)
  val_n, test_n = SPLITS[config.task]
  if config.task == "text" and config.data.val_fraction == 0:
    val_n = test_n     # LRA's code: validation is the test split
  validations = config.num_train_steps // config.eval_frequency
  val_batches = math.ceil(val_n / eval_batch)
  if config.num_eval_steps > 0:
    val_batches = min(val_batches, config.num_eval_steps)
  test_batches = math.ceil(test_n / eval_batch)
  m = config.model
  layers = m.num_layers - int(bool(m.last_block_cls_only))
  scores = 0.0
  if m.attention == "softmax":
    scores = layers * m.num_heads * (width + 1) ** 2 * SCORE_S     # per example
  activations = m.num_layers * (width + 1) * (m.emb_dim + m.mlp_dim) * ACTIVATION_S
  times = {"matmuls": train / (rate * 1e12), "scores": batch * scores,
           "activations": batch * activations}
  bound = max(times, key=times.get)
  step_s = times[bound]
  eval_batch_s = max(evalf / (rate * 1e12), eval_batch * (scores + activations) / 3)
  train_s = config.num_train_steps * step_s
  eval_s = (validations * val_batches + 2 * test_batches) * eval_batch_s
  return Budget(cell.name, width + 1, batch, config.num_train_steps, validations, val_batches,
                test_batches, train / 1e12, evalf / 1e12, rate, source, bound, 1.0 / step_s,
                train_s, eval_s, 2 * COMPILE_S, START_S)


def calls_needed(total_min: float) -> int:
  """Device calls of at most :data:`CALL_LIMIT_MIN` minutes that the cell needs."""
  return max(1, math.ceil(total_min / CALL_LIMIT_MIN))


def markdown(budgets: list[Budget]) -> str:
  """The table of docs/reproduce.md."""
  lines = ["| cell | width x batch | steps | train TFLOP/step | modelled steps/s (rate) | "
           "bound | train min | eval min (validations x batches) | total min | 9-min calls |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for b in budgets:
    lines.append(
        f"| `{b.cell}` | {b.width} x {b.batch} | {b.steps} | {b.train_tflop:.3f} | "
        f"{b.steps_per_sec:.1f} ({b.rate_tflops:.1f} TFLOP/s, {b.rate_source}) | {b.bound} | "
        f"{b.train_s / 60:.1f} | {b.eval_s / 60:.1f} ({b.validations} x {b.val_batches}) | "
        f"{b.total_min:.1f} | {calls_needed(b.total_min)} |")
  return "\n".join(lines) + "\n"


def main(argv=None) -> dict[str, Any]:
  """Models every cell (or ``--cells``), prints the table and writes JSON and markdown."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default=os.path.join(ROOT, "runs", "benchmarks", "paper_budget"))
  parser.add_argument("--cells", nargs="*", default=None, help="default: every cell")
  args = parser.parse_args(argv)
  cells = [reproduce.get_cell(n) for n in args.cells] if args.cells else list(reproduce.CELLS)
  budgets = [cell_budget(c) for c in cells]
  table = markdown(budgets)
  os.makedirs(args.out, exist_ok=True)
  record = {"model": __doc__.split("\n\n")[1:6], "rates_tflops": H100_RATES,
            "score_s": SCORE_S, "activation_s": ACTIVATION_S,
            "compile_s": COMPILE_S, "start_s": START_S, "splits": SPLITS,
            "cells": [{**dataclasses.asdict(b), "total_min": b.total_min,
                       "calls": calls_needed(b.total_min)} for b in budgets]}
  with open(os.path.join(args.out, "paper_budget.json"), "w", encoding="utf-8") as f:
    json.dump(record, f, indent=2)
  with open(os.path.join(args.out, "paper_budget.md"), "w", encoding="utf-8") as f:
    f.write("`python benchmarks/paper_budget.py --out " + os.path.relpath(args.out, ROOT)
            + "`\n\n" + table)
  print(table, end="")
  return record


if __name__ == "__main__":
  main()
