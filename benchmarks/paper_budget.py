"""Device minutes of each paper cell: a FLOP model for every cell, and the slot plan of the
cells a 15-minute GPU slot must hold, calibrated on measured H200 runs.

    python benchmarks/paper_budget.py --out benchmarks/results/nvidia-h200/paper_budget

**The FLOP model (every cell, H100 rates).** For every cell of ``scripts/reproduce.py`` the
config is built exactly as the cell's command builds it, and the analytic FLOPs
(``benchmarks/flops.py``: every matrix product of the jaxpr) of one train step and of one eval
batch are counted at the cell's global batch and full width (``max_length`` + CLS). A step
takes the longest of three times, each calibrated on a measurement of the H100 in bfloat16
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

An eval batch takes the same three times with its forward FLOPs and a third of the other two.
Then train = steps x step time, evaluation = (validations x val batches + 2 x test batches) x
eval batch time, compile = 2 programs x 27 s, start = 60 s. Measured on an H200, this model
was 1.35x optimistic for cell 2 (73.5 modelled H100 steps/s against 54.3 steady on the H200)
and 2.0x to 2.5x pessimistic for ListOps ``simple`` (11.6 to 11.7 modelled against 23.4 and
28.6 in ``train.py``), so it is kept only for the cells no GPU has run.

**The slot plan (cells 1, 2, 4 and 5b, H200 figures).** A slot is 15 device minutes: the
machine's start, one call of at most 9 minutes, the wait before the next call, and one call
of at most 5; a cell fits when the slot holds it with :data:`MARGIN_S` to spare. Each cell is
modelled from the measured H200 runs (:data:`H200`, each figure with its source), component
by component:

* **call 1**: the call's own start and the smoke test (``scripts/paper_call.sh``), then
  ``train.py``'s start (imports, data: ListOps generated on the device), the compiles, and
  training with its validations and saves until the call's time budget
  (``max_train_minutes``: the call's length less what ran before the cell and the reserve
  for what runs after the stop), then the stop's validation, save and tests;
* **call 2** (no smoke test): ``train.py``'s restart, the restore and the compiles read from
  the persistent cache, the rest of the training, the final validation, the tests, the
  comparison;
* **training**: steps / the steady steps/s measured in ``train.py`` for the cell's model and
  flags (its own run, or a ``train.py`` run of the same model; cell 1, which no GPU has
  run, takes the FLOP model's rate scaled by cell 2's measured/modelled ratio). For cell 5b
  (grouped batches at a few widths, :data:`GROUPED_WIDTH_SHARE`) a step at padded width ``w``
  takes ``FIXED_STEP_S + (t_full - FIXED_STEP_S) * w / w_full``: ``simple`` is linear in the
  length, and :data:`FIXED_STEP_S` is an allowance for the part that is not (the optimizer
  update, the host's share of a step);
* **validation**: per example, :data:`H200` ``eval_per_train_example`` of a train step's time
  per example at full width (cell 2: its 25,000-review validation against its steady step),
  scaled by the padded width for 5b, plus :data:`H200` ``validation_host_s`` per validation;
* **saves**: every ``checkpoint_every`` steps and at each new best validation
  (:data:`BEST_SAVES` assumed for 300 validations), :data:`H200` ``save_s_per_mb`` per MB of
  the train state (parameters and AdamW's two moments, float32).

The model is a plan, not a timing: the next slot's ``results.json`` and ``metrics.jsonl``
replace its figures (docs/reproduce.md). Writes ``paper_budget.json`` (every number) and
``paper_budget.md`` (both tables) to ``--out``; ``--cells`` limits the FLOP model,
``--slot_only`` skips it (the slot plan then reads the FLOP counts of cells 1 and 2 only).
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

from simpletron_jax.runtime import cli  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  """The command line (see the module docstring)."""
  parser = cli.ArgumentParser(prog="paper_budget.py", description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default=os.path.join(ROOT, "runs", "benchmarks", "paper_budget"))
  parser.add_argument("--cells", nargs="*", default=None,
                      help="cells of the FLOP model; default: every cell")
  parser.add_argument("--slot_only", action="store_true",
                      help="only the slot plan (the FLOP model of cells 1 and 2 only)")
  parser.add_argument("--listops_data", default=None,
                      help="a ListOps folder in LRA's layout: cell 5b's width mix from it "
                           "instead of GROUPED_WIDTH_SHARE and EVAL_WIDTHS_500")
  return parser.parse_args(argv)


if __name__ == "__main__":
  # The flags first: --help and a bad invocation end here, before the imports below load JAX.
  _ARGS = parse_args()

import jax  # noqa: E402

import flops  # noqa: E402
import reproduce  # noqa: E402
from simpletron_jax.data import batches  # noqa: E402
from simpletron_jax.data.common import bucketed_length  # noqa: E402
from simpletron_jax.model import encoders  # noqa: E402
from simpletron_jax.tools import tpu_aot  # noqa: E402
from simpletron_jax.train import run_config, steps, train_state  # noqa: E402


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
  eval_batch = batches.BatchConfig.from_config_dict(config).eval_rows()
  state = jax.eval_shape(lambda r: train_state.create_train_state(
      run_config.TrainConfig.from_config_dict(config), model, r, config.model.max_length),
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


# The slot plan, from the H200's measurements.

# The device slot (issue 60): 15 minutes in all, one call of at most 9 and one of at most 5.
SLOT_S = 15 * 60.0
CALL_S = (9 * 60.0, 5 * 60.0)
MARGIN_S = 60.0   # what a fitting cell leaves of the slot
# What paper_call.sh keeps free after a cell's time budget (RESERVE_S there): the step in
# progress, the stop's validation, save and tests, the comparison and the log copy.
RESERVE_S = 30.0
# Measured on an H200 (results/paper/text_transformer_lra_code: call1.log, call3.log and
# metrics.jsonl of cell 2; benchmarks/results/nvidia-h200/listops_train: listops.log and the
# three runs' metrics.jsonl). Times in seconds.
H200 = {
    # the device tool's lease after cell 2's first call, less the call (README there)
    "machine_start_s": 32.0,
    # from the first call's start to its cell's start: nvidia-smi and jax import (4 s), then
    # the smoke test, 20 :tiny steps (54 s) (call1.log: 07:57:53 to 07:58:51)
    "call_start_and_smoke_s": 58.0,
    # the gap between cell 2's first and last call, the idle machine counting (08:05:11 to
    # 08:05:30, a failed 0.3-s call included)
    "between_calls_s": 19.0,
    # from the cell's start to train.py's first record: ListOps with its 100,000 examples
    # generated on the device (02:17:42 to 02:18:20.3 in listops.log), text reading IMDB
    # (07:58:51 to 07:59:15.0)
    "start_s": {"listops": 38.3, "text": 24.0},
    # the same in a later call, the data on disk: ListOps 15.0 and 16.9 s (the later two runs
    # of listops.log), text 12.2 s (08:05:30 to 08:05:42.2); the restore is counted apart
    "restart_s": {"listops": 16.9, "text": 12.2},
    # train-step compiles: ListOps simple at full width with the CLS-only block 19.5 s, with
    # block_diagonal and length_multiple=8 too 14.6 s; LRA's text Transformer 36.9 s; the
    # same program read from the persistent cache 3.1 s (cell 2's second call)
    "train_compile_s": {"simple": 19.5, "simple_fast": 14.6, "softmax": 36.9},
    "cached_compile_s": 3.1,
    # an eval-step compile: ListOps' first validation, 2 batches of 32, ended 3.2 s after the
    # last train record (02:18:50.5 to 02:18:53.8), nearly all of it the compile
    "eval_compile_s": 3.2,
    # a save of ListOps simple's 233-MB train state: the stop's save, its wait and a 2-batch
    # test took 2.3 s between the validation and test records (02:18:53.8 to 02:18:56.1)
    "save_s_per_mb": 2.3 / 233.2,
    # cell 2: its validation of 25,000 reviews took 2.43 s (08:07:27.7 to 08:07:30.1), 97 us
    # an example, against 575 us an example of its steady train step (54.3 steps/s x 32)
    "eval_per_train_example": (2.43 / 25000) / (1 / (54.3 * 32)),
    # a validation's host work (batches built and sent, finiteness check, record): an allowance
    "validation_host_s": 0.05,
    # reproduce.py's comparison and paper_call.sh's copy after the tests (08:07:32.9-08:07:34)
    "finish_s": 1.1,
}
# Steady steps/s (the median of the train windows after the first) in train.py on the H200.
MEASURED_RATES = {
    "text_transformer_lra_code": (54.3, "cell 2's own run (median window)"),
    "listops_simple_cls_only": (23.4, "train.py ListOps at full width, CLS-only block "
                                "(listops_full_width.jsonl)"),
    "listops_simple_fast": (28.6, "train.py ListOps at full width with block_diagonal and "
                            "length_multiple=8 (listops_full_width_options.jsonl)"),
}
# Cell 5b's widths (512-token buckets, grouped batches of 32), from a 6,400-example sample of
# the seeded ListOps generator (the H200's data are the same generator's 96,000): the share
# of train batches at each padded width, and the widths of the validation's 4 batches of 500
# (sorted by length). Recompute with --listops_data on a sample made by
# python -c "from simpletron_jax.data import listops; listops.generate_dataset('/tmp/lo', seed=0,
#   num_workers=1, num_train=6400, num_val=2000, num_test=10)"
GROUPED_WIDTH_SHARE = {1024: 0.55, 1536: 0.30, 2000: 0.15}
EVAL_WIDTHS_500 = (1024, 1024, 1536, 2000)
FIXED_STEP_S = 0.005   # the part of a step that does not grow with the width (an allowance)
BEST_SAVES = 30        # new best validations in 300 (an assumption; a tiny run had 12 in 25)
TRAIN_STATE_BYTES_PER_PARAM = 12   # float32 parameters and AdamW's two moments


@dataclasses.dataclass
class SlotPlan:
  """One cell's modelled slot on the H200 (seconds) and its parts."""

  cell: str
  steps_per_sec: float
  rate_source: str
  train_s: float
  validations: int
  validation_s: float
  saves: int
  save_s: float
  compile_s: float
  cached_compile_s: float
  start_s: float
  restart_s: float
  stop_s: float
  call1_progress_s: float
  call1_s: float
  call2_s: float
  slot_s: float

  @property
  def fits(self) -> bool:
    """Two calls within their limits, and the slot with :data:`MARGIN_S` to spare."""
    return (self.call1_s <= CALL_S[0] and self.call2_s <= CALL_S[1]
            and self.slot_s <= SLOT_S - MARGIN_S)

  @property
  def over_s(self) -> float:
    """Seconds past the slot less the margin (negative: to spare beyond the margin)."""
    return self.slot_s - (SLOT_S - MARGIN_S)


def padded(width: int, length_multiple: int) -> int:
  """Positions a block sees for a ``width``-token batch: CLS added, then rounded up to
  ``length_multiple``."""
  return -(-(width + 1) // length_multiple) * length_multiple


def width_shares(data_dir: str, config) -> tuple[dict[int, float], tuple[int, ...]]:
  """Cell 5b's width mix from a ListOps folder in LRA's layout: the share of one epoch's
  grouped train batches at each padded width (:mod:`simpletron_jax.data.grouping`), and the
  widths of one validation's batches (``eval_batch_size``, sorted by length)."""
  from simpletron_jax.data import grouping, listops   # pylint: disable=import-outside-toplevel
  train = listops.load_split(data_dir, "train")
  val = listops.load_split(data_dir, "val")
  batch = batches.BatchConfig.from_config_dict(config)
  micro = batch.micro_batch_size
  stream = grouping.GroupedBatches(train.lengths, int(batch.seed), micro,
                                   batch.group_pool_batches)
  n = len(train) // micro
  counts: dict[int, int] = {}
  for i in range(n):
    w = batches.batch_width(train, stream[i], batch)
    counts[w] = counts.get(w, 0) + 1
  evals = tuple(batches.batch_width(val, idx, batch) for idx, _ in batches.eval_index_batches(
      val, batch, batches.eval_batch_size(batch)))
  return {w: c / n for w, c in sorted(counts.items())}, evals


def slot_plan(cell: reproduce.Cell, rate_key: str | None = None,
              flop_rates: dict[str, float] | None = None,
              shares: tuple[dict[int, float], tuple[int, ...]] | None = None,
              overrides: tuple[str, ...] = ()) -> SlotPlan:
  """The cell's two calls and its slot, from :data:`H200` (see the module docstring).

  ``rate_key``: a :data:`MEASURED_RATES` key, the steady full-width rate of the cell's model;
  None (a cell no GPU has run): ``flop_rates``, ``{"modelled": FLOP-model steps/s of the cell,
  "cell2_modelled": of cell 2}``, scaled by cell 2's measured/modelled ratio. ``shares``: the
  width mix of a bucketed ListOps cell (:func:`width_shares`; default
  :data:`GROUPED_WIDTH_SHARE` and :data:`EVAL_WIDTHS_500`). ``overrides``: ``--config.*`` flags
  after the cell's (:func:`reproduce.cell_config`). Raises ValueError for a bucketed cell other
  than ListOps at 512-token buckets and eval batches of 500, without ``shares``.
  """
  config = reproduce.cell_config(cell, overrides)
  m = config.model
  task = config.task
  if rate_key is not None:
    rate, source = MEASURED_RATES[rate_key]
  else:
    measured = MEASURED_RATES["text_transformer_lra_code"][0]
    ratio = measured / flop_rates["cell2_modelled"]
    rate = flop_rates["modelled"] * ratio
    source = (f"FLOP model {flop_rates['modelled']:.1f} x cell 2's measured/modelled "
              f"{ratio:.3f}")
  full = padded(m.max_length, m.length_multiple)
  step_full = 1.0 / rate
  val_n, test_n = SPLITS[task]
  if task == "text" and config.data.val_fraction == 0:
    val_n = test_n
  eval_example_full = step_full / config.batch_size * H200["eval_per_train_example"]
  step_s, eval_scale = step_full, 1.0
  train_programs, eval_programs = 1, 1
  if config.data.bucket > 0:   # bucketed ListOps (cell 5b): the width mix of a 512-token bucket
    if task != "listops" or (shares is None and (config.data.bucket != 512
                                                 or config.eval_batch_size != 500)):
      raise ValueError(f"{cell.name}: the width mix is known for ListOps at data.bucket=512 "
                       "and eval_batch_size=500 only; pass --listops_data")
    train_share, eval_widths = shares or (GROUPED_WIDTH_SHARE, EVAL_WIDTHS_500)
    eval_scale = sum(padded(w, m.length_multiple) for w in eval_widths) / (len(eval_widths)
                                                                         * full)
    eval_programs = len(set(eval_widths))
    # every width a batch can have, the rare ones too (precompile.train_scan_count)
    lowest = int(config.data.get("min_tokens", 0)) + 1
    train_programs = len({bucketed_length(n, config.data.bucket, m.max_length)
                          for n in range(lowest, m.max_length + 1)})
    if config.data.group_by_length:
      step_s = sum(share * (FIXED_STEP_S + (step_full - FIXED_STEP_S)
                            * padded(w, m.length_multiple) / full)
                   for w, share in train_share.items())
      source += f"; grouped widths {dict(train_share)}"
    else:   # random batches of 32 are at full width 98.5% of the time: counted as all of it
      source += "; random batches, all at full width"
  steps = config.num_train_steps
  train_s = steps * step_s
  validations = steps // config.eval_frequency
  one_validation = val_n * eval_example_full * eval_scale + H200["validation_host_s"]
  params = encoders_params(config)
  save_one = params * TRAIN_STATE_BYTES_PER_PARAM / 1e6 * H200["save_s_per_mb"]
  best = min(BEST_SAVES, validations)
  saves = steps // config.checkpoint_every + best
  family = ("softmax" if m.attention == "softmax" else
            "simple_fast" if m.length_multiple > 1 else "simple")
  compile_s = (train_programs * H200["train_compile_s"][family]
               + eval_programs * H200["eval_compile_s"])
  cached = (train_programs + eval_programs) * H200["cached_compile_s"]
  # After a stop: the validation, the save, the restore of the best-validation checkpoint,
  # and the tests of it and of the final parameters; then the comparison and the copy.
  test_s = 2 * test_n * eval_example_full * eval_scale
  stop_s = one_validation + 2 * save_one + test_s + H200["finish_s"]
  progress_s = train_s + validations * one_validation + saves * save_one
  before_cell = H200["call_start_and_smoke_s"]
  budget = CALL_S[0] - before_cell - RESERVE_S   # train.py's max_train_minutes, in seconds
  fixed1 = H200["start_s"][task] + compile_s
  progress1 = max(0.0, min(progress_s, budget - fixed1))
  if progress1 >= progress_s:   # done in the first call
    call1 = before_cell + fixed1 + progress_s + stop_s
    call2 = 0.0
  else:
    call1 = before_cell + budget + stop_s
    call2 = (H200["restart_s"][task] + save_one + cached + (progress_s - progress1) + stop_s)
  slot = H200["machine_start_s"] + call1 + (H200["between_calls_s"] + call2 if call2 else 0.0)
  return SlotPlan(cell.name, steps / train_s, source, train_s, validations,
                  one_validation, saves, save_one, compile_s, cached, H200["start_s"][task],
                  H200["restart_s"][task], stop_s, progress1, call1, call2, slot)


def encoders_params(config) -> int:
  """The parameter count of the cell's classifier (from shapes alone)."""
  vocab, classes, dual = tpu_aot.task_sizes(config)
  model = encoders.build_classifier(config.model, vocab_size=vocab, num_classes=classes,
                                    dual=dual)
  state = jax.eval_shape(lambda r: train_state.create_train_state(
      run_config.TrainConfig.from_config_dict(config), model, r, config.model.max_length),
                         jax.random.PRNGKey(0))
  return sum(int(math.prod(x.shape)) for x in jax.tree_util.tree_leaves(state.params))


def slot_markdown(plans: list[tuple[str, SlotPlan]]) -> str:
  """The slot table of docs/reproduce.md: minutes per part, per call and for the slot."""
  lines = ["| cell | steps/s (source) | train min | validations x s | saves x s | compiles "
           "s (cached) | call 1 min | call 2 min | slot min | fits 9 + 5, 1 min spare |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for label, p in plans:
    if p.fits:
      verdict = f"yes: {(SLOT_S - p.slot_s) / 60:.1f} min of the slot spare"
    else:
      verdict = f"no: {max(p.over_s, 0.0) / 60:.1f} min over {(SLOT_S - MARGIN_S) / 60:.0f}"
      if p.call2_s > CALL_S[1]:
        verdict += f", call 2 {p.call2_s / 60:.1f} min > {CALL_S[1] / 60:.0f}"
    lines.append(
        f"| {label} | {p.steps_per_sec:.1f} ({p.rate_source}) | {p.train_s / 60:.1f} | "
        f"{p.validations} x {p.validation_s:.2f} | {p.saves} x {p.save_s:.1f} | "
        f"{p.compile_s:.0f} ({p.cached_compile_s:.0f}) | {p.call1_s / 60:.1f} | "
        f"{p.call2_s / 60:.1f} | {p.slot_s / 60:.1f} | {verdict} |")
  return "\n".join(lines) + "\n"


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


# The slot plan's rows: (label, cell, MEASURED_RATES key or None for the FLOP model's,
# --config.* flags after the cell's).
SLOT_ROWS = (
    ("1 `listops_transformer_lra_code`", "listops_transformer_lra_code", None, ()),
    ("2 `text_transformer_lra_code` (ran: 8.4 device min for its two calls, 10.3 for the "
     "slot with a failed call)", "text_transformer_lra_code", "text_transformer_lra_code", ()),
    ("4 `listops_simple_authors` at the CLS-only rate (its `block_diagonal` not timed)",
     "listops_simple_authors", "listops_simple_cls_only", ()),
    ("4 `listops_simple_authors` if `block_diagonal` gives it 5b's full-width rate",
     "listops_simple_authors", "listops_simple_fast", ()),
    ("5b `listops_simple`", "listops_simple", "listops_simple_fast", ()),
    ("5b `listops_simple` without `group_by_length` (LRA's uniformly random batches)",
     "listops_simple", "listops_simple_fast", ("--config.data.group_by_length=False",)),
)


def main(argv=None, args: argparse.Namespace | None = None) -> dict[str, Any]:
  """Models every cell (or ``--cells``) and the slot plan, prints both tables and writes
  JSON and markdown. ``args``: the flags already parsed (:func:`parse_args`), as the script's
  own run passes them; else they are parsed from ``argv``."""
  args = parse_args(argv) if args is None else args
  if args.slot_only:
    names = ["listops_transformer_lra_code", "text_transformer_lra_code"]
  else:
    names = args.cells or [c.name for c in reproduce.CELLS]
    names += [n for n in ("listops_transformer_lra_code", "text_transformer_lra_code")
              if n not in names]
  budgets = {n: cell_budget(reproduce.get_cell(n)) for n in names}
  flop_rates = {"modelled": budgets["listops_transformer_lra_code"].steps_per_sec,
                "cell2_modelled": budgets["text_transformer_lra_code"].steps_per_sec}
  shares = None
  if args.listops_data:
    shares = width_shares(args.listops_data, reproduce.cell_config(
        reproduce.get_cell("listops_simple")))
  plans = [(label, slot_plan(reproduce.get_cell(name), key,
                             flop_rates if key is None else None,
                             shares if name == "listops_simple" else None, overrides))
           for label, name, key, overrides in SLOT_ROWS]
  shown = [] if args.slot_only else [budgets[n] for n in (args.cells or names)]
  table = markdown(shown) if shown else ""
  slot_table = slot_markdown(plans)
  os.makedirs(args.out, exist_ok=True)
  record = {"model": __doc__.split("\n\n")[1:5], "rates_tflops": H100_RATES,
            "score_s": SCORE_S, "activation_s": ACTIVATION_S,
            "compile_s": COMPILE_S, "start_s": START_S, "splits": SPLITS,
            "cells": [{**dataclasses.asdict(b), "total_min": b.total_min,
                       "calls": calls_needed(b.total_min)} for b in shown],
            "slot": {"slot_s": SLOT_S, "call_s": CALL_S, "margin_s": MARGIN_S,
                     "reserve_s": RESERVE_S, "h200": H200, "measured_rates": MEASURED_RATES,
                     "grouped_width_share": shares[0] if shares else GROUPED_WIDTH_SHARE,
                     "eval_widths": shares[1] if shares else EVAL_WIDTHS_500,
                     "fixed_step_s": FIXED_STEP_S, "best_saves": BEST_SAVES,
                     "plans": [{"label": label, **dataclasses.asdict(p), "fits": p.fits,
                                "over_s": p.over_s} for label, p in plans]}}
  with open(os.path.join(args.out, "paper_budget.json"), "w", encoding="utf-8") as f:
    json.dump(record, f, indent=2)
  command = " ".join(["python benchmarks/paper_budget.py", *(argv if argv is not None
                                                              else sys.argv[1:])])
  with open(os.path.join(args.out, "paper_budget.md"), "w", encoding="utf-8") as f:
    f.write(f"`{command}`\n\n## The slot plan (H200 figures)\n\n{slot_table}")
    if table:
      f.write(f"\n## The FLOP model (H100 rates, every cell)\n\n{table}")
  print(slot_table, end="")
  print(table, end="")
  return record


if __name__ == "__main__":
  main(args=_ARGS)
