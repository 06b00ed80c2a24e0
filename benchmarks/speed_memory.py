"""Speed and memory of every attention variant: LRA Table 2 (Tay et al., 2020), reproduced.

    python benchmarks/speed_memory.py                       # GPU/TPU: lengths 1K..32K, batch 32
    python benchmarks/speed_memory.py --dtype bfloat16      # the same in bfloat16
    python benchmarks/speed_memory.py --quick               # CPU: lengths 1K, 2K, 4K, batch 2
    python benchmarks/speed_memory.py --quick --variants softmax simple --lengths 256 512 \
        --out /tmp/speed_memory
    python benchmarks/speed_memory.py --variants simple --set last_block_cls_only=true
    python benchmarks/speed_memory.py --variants simple --set length_multiple=8
    python benchmarks/speed_memory.py --dtype bfloat16 --compile_workers 8   # many CPU cores

The model is LRA's byte-level text classifier (``text_classification/configs/base_tc_config.py``
of the LRA code): 4 layers, emb 256, 4 heads, qkv 256, mlp 1024, byte vocabulary 257, 2
classes, CLS pooling, sinusoidal positions, dropout and attention dropout 0.1, AdamW. Every
registered variant of :mod:`simpletron_jax.model.attention` is measured (``attention.names()`` at
run time), and ``softmax`` three times: ``softmax`` (the LRA einsum form, the ratio baseline),
``softmax_xla`` (``jax.nn.dot_product_attention(implementation="xla")``) and
``softmax_flash`` (``implementation="cudnn"``, cuDNN flash attention, with the key lengths
taken from the padding mask; off a GPU or in float32 it falls back to XLA and the record's
``fallbacks`` says why). The fused rows have no attention dropout, so they run with
``attention_dropout_rate = 0``. A variant whose module has a ``max_length`` field (AFT
full/local, Linformer, ...) gets ``attention_kwargs.max_length = length + 1`` (CLS).

Every (variant, length) cell runs in this one process:

* memory: the compiled step's ``memory_analysis()`` per device, ``argument + output + temp -
  alias`` bytes (alias = the donated train state). It matched the allocator's
  ``peak_bytes_in_use`` to 0.01% on an H100 (issue 10), and unlike that peak it is not
  cumulative over the cells of a process. A cell whose train state or estimate exceeds the
  memory limit (``--max_memory_gb``; default the device's ``bytes_limit``, on CPU 80% of RAM,
  times the device count since CPU devices share RAM) is recorded as ``OOM`` before it runs,
  and the variant's longer lengths are skipped.
* compiling: at each length every cell is lowered for abstract arguments and compiled
  first (the step and the train-state init; ``lower().compile()``, through a persistent
  compilation cache, ``--cache_dir``), in ``--compile_workers`` threads side by side, and only
  then are the cells run one by one, so no compile competes with a timed run. A cell whose
  compile raised beside others is compiled again alone. On the 2-core CPU machine 2 workers
  took 0.72x and 0.86x of the one-by-one time for 4 cells
  (``benchmarks/results/cpu/compile_workers.md``).
* steps/s: the real pmapped train step of :mod:`simpletron_jax.train.trainer` (forward,
  backward, AdamW) on a random full-length byte batch placed on the devices once. After
  compiling and one warm-up step, ``--rounds`` timed runs of ``--steps`` back-to-back steps
  each block once at their end; the median per-step time is reported. With
  ``--run_seconds S`` one more step is timed alone first, and a slow cell's runs get as many
  steps as fit in S seconds (at least 1), so the long lengths do not dominate the table's time.
* FLOPs: analytic, from the step's jaxpr (:mod:`flops`: every ``dot_general``, 2 FLOPs per
  multiply-add, plus cuDNN attention), per device. XLA's ``cost_analysis()`` is kept as
  ``xla_cost_analysis_flops``; on GPU it leaves out cuBLAS and cuDNN calls. Achieved FLOP/s is
  compared with a timed square ``jnp.dot`` (the matmul peak, measured once per run in the
  benchmark's dtype).

Writes ``speed_memory.json`` (every raw number, machine, jax version, command line),
``speed_memory.md`` (Table 2 layout) and ``speed_memory.png`` (log-log speed and memory
against length) to ``--out`` (default ``runs/benchmarks/<device>/``; the committed ones only
when named: ``--out 'benchmarks/results/{device}'``).

``speed_memory.json`` (schema_version 2; version 1 files, one process per cell and XLA's
FLOPs, still render with :func:`markdown_report`):

* ``command``, ``argv``, ``created`` (UTC ISO time), ``benchmark`` = ``"speed_memory"``.
* ``wall_s``: seconds the whole run took, the matmul-peak measurement included.
* ``settings``: ``labels``, ``lengths``, ``batch``, ``dtype``, ``steps``, ``rounds``,
  ``run_seconds``, ``quick``, ``max_memory_bytes``, ``in_process`` (True),
  ``compile_workers``, ``model``
  (``config.model``), ``vocab_size``, ``num_classes``.
* ``machine``: ``platform``, ``device_kind``, ``device_slug``, ``n_devices``, ``cpu_count``,
  ``cpus_usable`` (the process's CPU affinity, e.g. under ``taskset``),
  ``host_ram_bytes``, ``device_bytes_limit``, ``python``, ``jax``, ``jaxlib``, ``flax``,
  ``numpy``, ``os``, ``XLA_FLAGS``, ``XLA_PYTHON_CLIENT_MEM_FRACTION`` and ``matmul_peak``
  ``{dtype: {n, dtype, median_s, flops, flops_per_s}}`` for float32 and bfloat16.
* ``memory_metric``, ``flops_metric`` (what the numbers mean), ``baseline`` = ``"softmax"``.
* ``results``: one record per (label, length): ``label``, ``length``, ``batch``, ``status``
  (``ok`` / ``OOM`` / ``skipped`` / ``error``), ``reason``, ``wall_s`` (=
  ``prepare_wall_s``, building and compiling, which overlaps other cells' with several
  workers, + ``run_wall_s``); ``error_type`` when preparing raised, ``retried_alone`` when
  it was prepared again alone; once built also
  ``attention``, ``attention_kwargs``, ``note``, ``model``, ``train_state_bytes``; once
  compiled ``compile_s``, ``fallbacks``, ``memory_analysis`` (the XLA fields and
  ``estimate_bytes``), ``flops_per_step_per_device``, ``flop_count``,
  ``xla_cost_analysis_flops``; when ``ok`` also ``median_s_per_step``, ``steps_per_sec``,
  ``steps_per_run``, ``probe_s`` (with ``run_seconds``), ``step_times_s``,
  ``memory_bytes``, ``memory_source``, ``peak_bytes_in_use``, ``n_devices``, ``final_loss``,
  ``achieved_flops_per_s_per_device``, ``achieved_fraction_of_peak``, ``fastest_softmax``,
  ``speedup_vs_softmax``, ``memory_ratio_vs_softmax``, ``speedup_vs_fastest_softmax``,
  ``memory_ratio_vs_fastest_softmax`` (None where the baseline did not run).
* ``time_ratio``: ``short``, ``long`` (1024 and 4096 when both run, else the shortest and
  longest lengths) and ``by_label`` ``{label: t(long) / t(short) or None}``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import json
import os
import platform
import re
import shlex
import statistics
import sys
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _path in (ROOT, HERE):
  if _path not in sys.path:
    sys.path.insert(0, _path)

from simpletron_jax.runtime import cli  # noqa: E402

BYTE_VOCAB = 257           # LRA text: byte ids 1..256, 0 = pad
NUM_CLASSES = 2
BASELINE = "softmax"       # einsum softmax: the ratio baseline (LRA's Transformer)
XLA = "softmax_xla"        # jax.nn.dot_product_attention(implementation="xla")
FLASH = "softmax_flash"    # jax.nn.dot_product_attention(implementation="cudnn")
SOFTMAX_LABELS = (BASELINE, XLA, FLASH)
LEGACY_LABELS = {"softmax_fused": XLA}   # rows of older result files
FUSED_IMPLEMENTATIONS = {XLA: "xla", FLASH: "flash", "softmax_fused": "xla"}
DEFAULT_LENGTHS = (1024, 2048, 3072, 4096, 8192, 16384, 32768)
QUICK_LENGTHS = (1024, 2048, 4096)
LRA_SHORT, LRA_LONG = 1024, 4096   # LRA Table 2 reports time(4K) / time(1K)
GIB = 2.0 ** 30
MEMORY_METRIC = ("compiled.memory_analysis() of the pmapped step, argument + output + temp "
                 "- alias bytes per device (it matched the allocator's peak_bytes_in_use to "
                 "0.01% on an H100, issue 10)")
FLOPS_METRIC = ("analytic: the step's dot_general FLOPs (2 per multiply-add) plus cuDNN "
                "attention, from its jaxpr (benchmarks/flops.py), per device")
STATUSES = ("ok", "OOM", "skipped", "error")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  """The command-line flags (see the module docstring)."""
  parser = cli.ArgumentParser(prog="speed_memory.py",
                              description=__doc__.split("\n", maxsplit=1)[0])
  parser.add_argument("--variants", nargs="+", default=None,
                      help="row labels (default: every registered attention plus "
                      "softmax_xla and softmax_flash)")
  parser.add_argument("--lengths", nargs="+", type=int, default=None,
                      help=f"input lengths (default {' '.join(map(str, DEFAULT_LENGTHS))}; "
                      f"--quick: {' '.join(map(str, QUICK_LENGTHS))})")
  parser.add_argument("--batch", type=int, default=None, help="global batch (default 32; "
                      "--quick: 2)")
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                      help="model.dtype")
  parser.add_argument("--steps", type=int, default=None,
                      help="steps per timed run (default 10; --quick: 2)")
  parser.add_argument("--rounds", type=int, default=3,
                      help="timed runs per cell; each blocks once (default 3)")
  parser.add_argument("--set", nargs="+", default=(), metavar="FIELD=VALUE",
                      help="model.* overrides for every cell, e.g. last_block_cls_only=true "
                      "(values parsed as JSON, else kept as strings)")
  parser.add_argument("--cache_dir", default=os.path.join(
      os.path.expanduser("~"), ".cache", "simpletron_jax", "jax_compilation_cache"),
                      help="persistent XLA compilation cache ('' to disable)")
  parser.add_argument("--quick", action="store_true",
                      help="CPU mode: batch 2, lengths 1K, 2K and 4K, 2 steps x 3 runs "
                      "(every variant: most of an hour on one core; a few: minutes)")
  parser.add_argument("--out", default=None,
                      help="results folder, '{device}' replaced by the device (default "
                      "runs/benchmarks/<device>/; the committed ones: --out "
                      "benchmarks/results/{device})")
  parser.add_argument("--max_memory_gb", type=float, default=None,
                      help="record OOM, without running it, for a config whose train state "
                      "or compiled memory estimate exceeds this (default: the device's "
                      "bytes_limit; CPU: 80%% of RAM)")
  parser.add_argument("--matmul_n", type=int, default=None,
                      help="matrix side for the matmul peak (default 8192; CPU 1024)")
  parser.add_argument("--in_process", action="store_true",
                      help="accepted for old commands; every cell runs in this process")
  parser.add_argument("--run_seconds", type=float, default=0.0,
                      help="cut each timed run of a slow cell to about this many seconds "
                      "(at least 1 step; timed from one extra step); 0: --steps every time")
  parser.add_argument("--compile_workers", type=int, default=1,
                      help="threads that compile a length's cells side by side before they "
                      "run one by one (default 1)")
  parser.add_argument("--resume", action="store_true",
                      help="reuse the records of an interrupted run with the same settings "
                      "(<out>/speed_memory.partial.jsonl)")
  return parser.parse_args(argv)


if __name__ == "__main__":
  # The flags first: --help and a bad invocation end here, before the imports below load JAX.
  _ARGS = parse_args()

import flax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

import flops  # noqa: E402
import step_time  # noqa: E402
from simpletron_jax.model import attention, encoders  # noqa: E402
from simpletron_jax.model.attention import softmax as softmax_attention  # noqa: E402
from simpletron_jax.runtime import xla_cache  # noqa: E402
from simpletron_jax.train import run_config, train_state  # noqa: E402
from simpletron_jax.train.steps import pmap_steps, replicate  # noqa: E402


# ----------------------------------------------------------------------------
# Configs and variants.


def lra_text_config(length: int, attention_name: str, attention_kwargs: dict[str, Any],
                    batch: int, dtype: str,
                    model_overrides: dict[str, Any] | None = None) -> ml_collections.ConfigDict:
  """The LRA text-classification Transformer config at input ``length``.

  Follows LRA ``text_classification/configs/base_tc_config.py`` (batch 32, lr 0.05 rsqrt,
  warmup 8000, 20000 steps, weight decay 0.1, Adam(0.9, 0.98, 1e-9); 4 layers, emb 256,
  4 heads, qkv 256, mlp 1024, dropout 0.1, CLS pooling, sinusoidal positions).

  Args:
    length: input tokens per example, CLS excluded (``model.max_length``).
    attention_name: registry name (``model.attention``).
    attention_kwargs: ``model.attention_kwargs``.
    batch: global batch (``batch_size``).
    dtype: ``"float32"`` or ``"bfloat16"`` (``model.dtype``).
    model_overrides: other ``model.*`` fields to replace (tests shrink the model).

  Returns:
    A config with every field :mod:`simpletron_jax.train.trainer` reads to build the
    optimizer and the train state.

  Raises:
    ValueError: if ``model_overrides`` names a field the model config lacks.
  """
  config = ml_collections.ConfigDict()
  config.task = "text"
  config.seed = 0
  config.batch_size = batch
  config.grad_accum_steps = 1
  config.num_train_steps = 20000
  config.learning_rate = 0.05
  config.factors = "constant * linear_warmup * rsqrt_decay"
  config.warmup = 8000
  config.weight_decay = 0.1
  config.adam_b1 = 0.9
  config.adam_b2 = 0.98
  config.adam_eps = 1e-9
  config.model = ml_collections.ConfigDict()
  config.model.attention = attention_name
  config.model.attention_kwargs = ml_collections.ConfigDict(dict(attention_kwargs))
  config.model.emb_dim = 256
  config.model.num_heads = 4
  config.model.qkv_dim = 256
  config.model.mlp_dim = 1024
  config.model.num_layers = 4
  config.model.max_length = length
  config.model.dropout_rate = 0.1
  config.model.attention_dropout_rate = 0.1
  config.model.learn_pos_emb = False
  config.model.classifier_pool = "CLS"
  config.model.last_block_cls_only = False
  config.model.length_multiple = 1
  config.model.mlp_activation = "gelu_tanh"
  config.model.dtype = dtype
  for field, value in (model_overrides or {}).items():
    if field not in config.model:
      raise ValueError(f"model_overrides names model.{field}, which the LRA text config "
                       f"lacks; fields: {sorted(config.model)}")
    config.model[field] = value
  return config


def variant_labels() -> list[str]:
  """Every benchmark row label: the registry names, with ``softmax_xla`` and
  ``softmax_flash`` after ``softmax``."""
  labels = []
  for name in attention.names():
    labels.append(name)
    if name == BASELINE:
      labels += [XLA, FLASH]
  return labels


@dataclasses.dataclass(frozen=True)
class VariantSetup:
  """How one row label maps onto ``config.model``.

  Attributes:
    label: the row label, e.g. ``"softmax_fused"``.
    attention: ``model.attention``.
    attention_kwargs: ``model.attention_kwargs``.
    model_overrides: other ``model.*`` fields (``attention_dropout_rate`` for fused).
    note: what differs from the plain registry entry, for the report.
  """

  label: str
  attention: str
  attention_kwargs: dict[str, Any]
  model_overrides: dict[str, Any]
  note: str = ""


def variant_setup(label: str, length: int) -> VariantSetup:
  """The config of row ``label`` at input ``length`` (tokens, CLS excluded).

  ``softmax_xla`` and ``softmax_flash`` run with ``attention_dropout_rate = 0``: the fused
  implementations have no attention dropout (``softmax_fused``, the row name of older
  result files, is ``softmax_xla``).

  Raises:
    ValueError: for a label that is neither a registered attention nor a softmax row;
      the message lists the known labels.
  """
  if label == BASELINE:
    return VariantSetup(label, "softmax", {"implementation": "einsum"}, {})
  if label in FUSED_IMPLEMENTATIONS:
    impl = FUSED_IMPLEMENTATIONS[label]
    what = ("implementation='cudnn', cuDNN flash attention with key lengths from the mask; "
            "falls back to XLA where it cannot run (logged, see fallbacks)" if impl == "flash"
            else "implementation='xla'")
    return VariantSetup(label, "softmax", {"implementation": impl},
                        {"attention_dropout_rate": 0.0},
                        f"jax.nn.dot_product_attention, {what}; no attention dropout "
                        "(attention_dropout_rate=0)")
  if label not in attention.names():
    raise ValueError(f"unknown variant {label!r} (flag --variants); known: "
                     f"{', '.join(variant_labels())}")
  spec = attention.get(label)
  kwargs: dict[str, Any] = {}
  note = ""
  fields = {f.name for f in dataclasses.fields(spec.module)}
  if "max_length" in fields and "max_length" not in spec.fixed_kwargs:
    kwargs["max_length"] = length + 1   # the CLS token
    note = "attention_kwargs.max_length = length + 1"
  return VariantSetup(label, label, kwargs, {}, note)


# ----------------------------------------------------------------------------
# Measurements (run inside a worker subprocess, or in-process with --in_process).


def _tree_bytes(tree) -> int:
  return int(sum(x.size * np.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)))


def _is_oom(error: BaseException) -> bool:
  text = str(error)
  return (isinstance(error, MemoryError) or "RESOURCE_EXHAUSTED" in text
          or "out of memory" in text.lower())


def _first_line(error: BaseException, limit: int = 300) -> str:
  text = f"{type(error).__name__}: {error}".strip().splitlines()[0]
  return text[:limit]


def slugify(text: str) -> str:
  """``"NVIDIA H200"`` -> ``"nvidia-h200"``: lower case, runs of other characters -> ``-``."""
  return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def matmul_peak(n: int, dtype: str, reps: int = 5) -> dict[str, Any]:
  """Times a jitted ``[n, n] @ [n, n]`` ``jnp.dot`` on the default device.

  Args:
    n: matrix side.
    dtype: ``"float32"`` or ``"bfloat16"`` (float32 uses JAX's default matmul precision,
      as the model does; on NVIDIA GPUs that may be TF32).
    reps: timed repetitions after one warm-up call.

  Returns:
    ``{"n", "dtype", "median_s", "flops", "flops_per_s"}`` with ``flops = 2 n^3``.
  """
  key_a, key_b = jax.random.split(jax.random.PRNGKey(0))
  a_NxN = jax.random.normal(key_a, (n, n), jnp.float32).astype(dtype)
  b_NxN = jax.random.normal(key_b, (n, n), jnp.float32).astype(dtype)
  dot = jax.jit(jnp.dot)
  jax.block_until_ready(dot(a_NxN, b_NxN))
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    jax.block_until_ready(dot(a_NxN, b_NxN))
    times.append(time.perf_counter() - start)
  median = statistics.median(times)
  flops = 2.0 * n ** 3
  return {"n": n, "dtype": dtype, "median_s": median, "flops": flops,
          "flops_per_s": flops / median}


def machine_info(matmul_n: int | None = None) -> dict[str, Any]:
  """Device, software versions and the matmul peak of this process's default backend.

  Args:
    matmul_n: matrix side for :func:`matmul_peak`; default 8192 on accelerators, 1024 on CPU.

  Returns:
    A JSON-ready dict: ``platform``, ``device_kind``, ``device_slug`` (``"cpu"`` or e.g.
    ``"nvidia-h200"``), ``n_devices``, ``cpu_count``, ``cpus_usable``, ``host_ram_bytes``,
    ``device_bytes_limit`` (accelerators), versions, ``XLA_FLAGS`` and ``matmul_peak``
    (one entry per dtype).
  """
  device = jax.local_devices()[0]
  slug = "cpu" if device.platform == "cpu" else slugify(device.device_kind)
  stats = _memory_stats(device)
  try:
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    ram = None
  n = matmul_n or (1024 if device.platform == "cpu" else 8192)
  import jaxlib  # noqa: PLC0415
  return {
      "platform": device.platform, "device_kind": device.device_kind, "device_slug": slug,
      "n_devices": jax.local_device_count(), "cpu_count": os.cpu_count(),
      "cpus_usable": (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count()),
      "host_ram_bytes": ram, "device_bytes_limit": (stats or {}).get("bytes_limit"),
      "python": platform.python_version(), "jax": jax.__version__,
      "jaxlib": jaxlib.__version__, "flax": flax.__version__, "numpy": np.__version__,
      "os": platform.platform(), "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
      "XLA_PYTHON_CLIENT_MEM_FRACTION": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
      "matmul_peak": {dt: matmul_peak(n, dt) for dt in ("float32", "bfloat16")},
  }


def _memory_stats(device) -> dict[str, Any] | None:
  try:
    return device.memory_stats()
  except Exception:  # noqa: BLE001  (backends without allocator statistics raise or return None)
    return None


def _memory_analysis(compiled) -> dict[str, int] | None:
  analysis = compiled.memory_analysis()
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0] if analysis else None
  if analysis is None:
    return None
  fields = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
            "temp_size_in_bytes", "generated_code_size_in_bytes")
  out = {f: int(getattr(analysis, f, 0) or 0) for f in fields}
  out["estimate_bytes"] = (out["argument_size_in_bytes"] + out["output_size_in_bytes"]
                           + out["temp_size_in_bytes"] - out["alias_size_in_bytes"])
  return out


def _flops(compiled) -> float | None:
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  flops = (cost or {}).get("flops")
  return float(flops) if flops is not None and flops >= 0 else None


def _host_batch(batch: int, length: int, n_dev: int) -> dict[str, np.ndarray]:
  """A random full-length byte batch in host memory, ``[n_dev, batch / n_dev, ...]``."""
  return step_time.random_batch(np.random.default_rng(0), batch, length, BYTE_VOCAB, n_dev,
                                NUM_CLASSES)


def _device_batch(batch: int, length: int, n_dev: int) -> dict[str, jax.Array]:
  """:func:`_host_batch`, sharded onto the local devices once (resident)."""
  data = _host_batch(batch, length, n_dev)
  mesh = jax.sharding.Mesh(np.array(jax.local_devices()), ("devices",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("devices"))
  return {k: jax.device_put(v, sharding) for k, v in data.items()}


def _compile(p_train, state, data, key, record: dict[str, Any]):
  """Lowers and compiles the pmapped step for abstract arguments; counts its FLOPs.

  Records ``compile_s`` (lowering and compiling), ``phase_s["flop_count"]``, ``fallbacks``
  (the softmax module's fallback reasons met while this thread traced),
  ``flop_count``, ``flops_per_step_per_device`` and ``xla_cost_analysis_flops``.
  """
  with softmax_attention.recording_fallbacks() as reasons:
    start = time.perf_counter()
    compiled = p_train.lower(state, data, key).compile()
    record["compile_s"] = time.perf_counter() - start
    start = time.perf_counter()
    count = flops.function_flops(p_train, state, data, key)
    record["phase_s"]["flop_count"] = time.perf_counter() - start
  record["fallbacks"] = sorted(set(reasons))
  record["flop_count"] = dataclasses.asdict(count)
  record["flops_per_step_per_device"] = count.total
  record["xla_cost_analysis_flops"] = _flops(compiled)
  return compiled


def _timed_rounds(compiled, state, data, keys, steps: int, rounds: int):
  """Runs ``rounds`` timed runs of ``steps`` back-to-back steps, blocking once per run.

  Returns:
    ``(state, sums, per-step seconds of each run)``.
  """
  times = []
  for r in range(rounds):
    start = time.perf_counter()
    for i in range(steps):
      state, sums = compiled(state, data, keys[r * steps + i])
    jax.block_until_ready((state, sums))
    times.append((time.perf_counter() - start) / steps)
  return state, sums, times


@dataclasses.dataclass
class PreparedCell:
  """One (variant, length) cell, compiled and not yet run (:func:`prepare_cell`).

  Attributes:
    record: the cell's record so far (:func:`measure_config` lists its fields).
    init: the compiled train-state init, ``rng -> TrainState`` (unreplicated).
    step: the compiled pmapped train step, ``(state, batch, rng) -> (state, sums)``.
    rng: the parameter-init key.
    batch, length: global batch and input tokens (CLS excluded).
    memory_bytes: the compiled step's memory estimate per device, or None.
  """
  record: dict[str, Any]
  init: Any
  step: Any
  rng: jax.Array
  batch: int
  length: int
  memory_bytes: int | None


def prepare_cell(label: str, length: int, batch: int, dtype: str,
                 max_memory_bytes: float | None = None,
                 model_overrides: dict[str, Any] | None = None,
                 ) -> tuple[dict[str, Any], PreparedCell | None]:
  """Builds and compiles one cell without touching the device: thread-safe, for a pool.

  The train state and batch are abstract (``jax.ShapeDtypeStruct``) while the step and the
  init are lowered and compiled, so cells compile side by side in threads
  (``--compile_workers``) while no device memory is held.

  Args:
    See :func:`measure_config`.

  Returns:
    ``(record, cell)``: ``cell`` is None when the record is final already (``OOM`` from the
    train state or the compiled estimate, or ``error``); else :func:`run_cell` runs it.
    Never raises for a failing config.
  """
  record: dict[str, Any] = {"label": label, "length": length, "batch": batch,
                            "status": "error", "reason": "", "phase_s": {}}
  try:
    setup = variant_setup(label, length)
    overrides = {**setup.model_overrides, **(model_overrides or {})}
    config = lra_text_config(length, setup.attention, setup.attention_kwargs, batch, dtype,
                             overrides)
    record.update(attention=setup.attention, attention_kwargs=setup.attention_kwargs,
                  note=setup.note, model=config.model.to_dict())
    n_dev = jax.local_device_count()
    if batch % n_dev:
      raise ValueError(f"--batch {batch} is not divisible by the {n_dev} local devices")
    host_share = n_dev if jax.local_devices()[0].platform == "cpu" else 1  # CPUs share RAM
    model = encoders.build_classifier(config.model, vocab_size=BYTE_VOCAB,
                                      num_classes=NUM_CLASSES)
    rng = jax.random.PRNGKey(config.seed)
    start = time.perf_counter()
    lowered_init = jax.jit(lambda r: train_state.create_train_state(
        run_config.TrainConfig.from_config_dict(config), model, r,
        config.model.max_length)).lower(rng)
    state_shapes = lowered_init.out_info   # the train state's shapes, traced once
    state_bytes = _tree_bytes(state_shapes)
    record["train_state_bytes"] = state_bytes
    if max_memory_bytes and state_bytes * host_share > max_memory_bytes:
      record.update(status="OOM", reason=f"train state {state_bytes / GIB:.2f} GiB x "
                    f"{host_share} exceeds the memory limit {max_memory_bytes / GIB:.2f} GiB")
      return record, None
    init = lowered_init.compile()
    record["phase_s"]["init_compile"] = time.perf_counter() - start
    state = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct((n_dev, *x.shape), x.dtype), state_shapes)
    data = {k: jax.ShapeDtypeStruct(v.shape, v.dtype)
            for k, v in _host_batch(batch, length, n_dev).items()}
    p_train, _ = pmap_steps(model.apply)
    step = _compile(p_train, state, data, jax.random.PRNGKey(1), record)
    analysis = _memory_analysis(step)
    record["memory_analysis"] = analysis
    if (max_memory_bytes and analysis is not None
        and analysis["estimate_bytes"] * host_share > max_memory_bytes):
      record.update(status="OOM", reason=f"compiled memory estimate "
                    f"{analysis['estimate_bytes'] / GIB:.2f} GiB x {host_share} exceeds "
                    f"the memory limit {max_memory_bytes / GIB:.2f} GiB")
      return record, None
    return record, PreparedCell(record, init, step, rng, batch, length,
                                analysis["estimate_bytes"] if analysis else None)
  except Exception as error:  # noqa: BLE001  (any failure is this config's result)
    record.update(status="OOM" if _is_oom(error) else "error", reason=_first_line(error),
                  error_type=type(error).__name__)
    return record, None


def steps_per_run(steps: int, run_seconds: float, probe_s: float) -> int:
  """Steps in each timed run: ``steps``, or with ``run_seconds > 0`` as many as fit in
  ``run_seconds`` at ``probe_s`` seconds a step, at least 1 and at most ``steps``."""
  if run_seconds <= 0:
    return steps
  return max(1, min(steps, int(run_seconds / max(probe_s, 1e-9))))


def run_cell(cell: PreparedCell, steps: int, rounds: int = 3,
             run_seconds: float = 0.0) -> dict[str, Any]:
  """Runs a :func:`prepare_cell` cell on the devices: init, a warm-up step, the timed runs.

  Args:
    cell: the prepared cell.
    steps: steps per timed run (at most, with ``run_seconds``).
    rounds: timed runs; the median per-step time is reported.
    run_seconds: if > 0, one more untimed step is timed alone (``probe_s``) and each run
      gets :func:`steps_per_run` steps, so a slow cell (long lengths) runs about this long
      per run instead of ``steps`` steps. 0: always ``steps``.

  Returns:
    ``cell.record``, completed (status ``ok``, or ``OOM`` / ``error`` when running raised),
    with ``steps_per_run`` and, with ``run_seconds``, ``probe_s``. Never raises for a
    failing config.
  """
  record, phases = cell.record, cell.record["phase_s"]
  state = data = None
  try:
    n_dev = jax.local_device_count()
    start = time.perf_counter()
    state = replicate(cell.init(cell.rng))
    jax.block_until_ready(state)
    phases["init"] = time.perf_counter() - start
    data = _device_batch(cell.batch, cell.length, n_dev)
    keys = jax.random.split(jax.random.PRNGKey(1), 2 + steps * rounds)
    start = time.perf_counter()
    state, sums = cell.step(state, data, keys[0])   # warm-up step
    jax.block_until_ready(sums)
    phases["warmup"] = time.perf_counter() - start
    n = steps
    if run_seconds > 0:
      start = time.perf_counter()
      state, sums = cell.step(state, data, keys[-1])   # the probe, untimed in the result
      jax.block_until_ready(sums)
      record["probe_s"] = phases["probe"] = time.perf_counter() - start
      n = steps_per_run(steps, run_seconds, record["probe_s"])
    record["steps_per_run"] = n
    start = time.perf_counter()
    state, sums, times = _timed_rounds(cell.step, state, data, keys[1:], n, rounds)
    phases["timed"] = time.perf_counter() - start
    median = statistics.median(times)
    peaks = [(_memory_stats(d) or {}).get("peak_bytes_in_use") for d in jax.local_devices()]
    record.update(status="ok", reason="", median_s_per_step=median,
                  steps_per_sec=1.0 / median, step_times_s=times, n_devices=n_dev,
                  memory_bytes=cell.memory_bytes,
                  memory_source="memory_analysis" if cell.memory_bytes else "unavailable",
                  peak_bytes_in_use=max((p for p in peaks if p is not None), default=None),
                  final_loss=float(np.asarray(sums["metrics"].loss.total)[0]
                                   / np.asarray(sums["metrics"].loss.count)[0]))
  except Exception as error:  # noqa: BLE001  (any failure is this config's result)
    record.update(status="OOM" if _is_oom(error) else "error", reason=_first_line(error))
  finally:
    del state, data
  return record


def measure_config(label: str, length: int, batch: int, dtype: str, steps: int,
                   max_memory_bytes: float | None = None,
                   model_overrides: dict[str, Any] | None = None,
                   rounds: int = 3, run_seconds: float = 0.0) -> dict[str, Any]:
  """Steps/s, memory and FLOPs of one (variant, length): :func:`prepare_cell`, :func:`run_cell`.

  Args:
    label: a row label (:func:`variant_labels`).
    length: input tokens per example, CLS excluded.
    batch: global batch, split over the local devices by ``pmap``.
    dtype: ``model.dtype``.
    steps: train steps per timed run; each run blocks once, at its end.
    max_memory_bytes: if set, a config whose train state or compiled memory estimate
      (times the local device count on CPU, where devices share RAM) exceeds it is recorded
      as ``OOM`` without running.
    model_overrides: extra ``model.*`` fields (tests shrink the model).
    rounds: timed runs after the warm-up step; the median per-step time is reported.
    run_seconds: see :func:`run_cell`.

  Returns:
    A JSON-ready record: ``label``, ``length``, ``batch``, ``status`` (``"ok"``, ``"OOM"``
    or ``"error"``), ``reason``; once compiled ``compile_s`` (lowering and compiling the
    step), ``memory_analysis``, ``flops_per_step_per_device`` (analytic, :mod:`flops`),
    ``flop_count``, ``xla_cost_analysis_flops``, ``fallbacks`` (the softmax module's
    fallback reasons), ``phase_s`` (seconds spent on ``init_compile``: tracing and compiling
    the train state's init; ``flop_count``; ``init``: running it; ``warmup``: the first step;
    ``timed``: the timed runs; with ``compile_s`` and the record's ``wall_s`` they say where a
    cell's time goes); for ``ok`` also ``median_s_per_step``, ``steps_per_sec``,
    ``step_times_s`` (per-step seconds of each timed run), ``memory_bytes`` (the compiled
    estimate), ``memory_source``, ``peak_bytes_in_use`` (allocator peak, cumulative in a
    process), ``train_state_bytes``, ``final_loss``. Never raises for a failing config; the
    failure is the record's ``status`` and ``reason``.
  """
  record, cell = prepare_cell(label, length, batch, dtype, max_memory_bytes, model_overrides)
  return record if cell is None else run_cell(cell, steps, rounds, run_seconds)


# ----------------------------------------------------------------------------
# Orchestration.


def add_ratios(results: list[dict[str, Any]]) -> None:
  """Adds, in place, each ok record's ratios to the softmax rows at the same length.

  ``speedup_vs_softmax`` = steps/s over einsum softmax's, ``memory_ratio_vs_softmax`` =
  memory over its memory; ``*_vs_fastest_softmax`` use whichever of ``softmax``,
  ``softmax_xla`` and ``softmax_flash`` (or an older file's ``softmax_fused``) has the most
  steps/s at that length (named in ``fastest_softmax``).
  A ratio is None where its baseline did not run.
  """
  by_key = {(r["label"], r["length"]): r for r in results if r["status"] == "ok"}
  for record in results:
    if record["status"] != "ok":
      continue
    length = record["length"]
    base = by_key.get((BASELINE, length))
    softmaxes = [by_key[(s, length)] for s in (*SOFTMAX_LABELS, *LEGACY_LABELS)
                 if (s, length) in by_key]
    fastest = max(softmaxes, key=lambda r: r["steps_per_sec"], default=None)
    record["fastest_softmax"] = fastest["label"] if fastest else None
    for suffix, ref in (("softmax", base), ("fastest_softmax", fastest)):
      record[f"speedup_vs_{suffix}"] = (record["steps_per_sec"] / ref["steps_per_sec"]
                                        if ref else None)
      record[f"memory_ratio_vs_{suffix}"] = (
          record["memory_bytes"] / ref["memory_bytes"]
          if ref and record.get("memory_bytes") and ref.get("memory_bytes") else None)


def time_ratio_lengths(lengths: list[int]) -> tuple[int, int]:
  """The (short, long) pair of the time-growth column: (1024, 4096) as in LRA Table 2 when
  both are benchmarked, else the shortest and longest requested lengths."""
  if LRA_SHORT in lengths and LRA_LONG in lengths:
    return LRA_SHORT, LRA_LONG
  return min(lengths), max(lengths)


def default_memory_limit(machine: dict[str, Any]) -> float | None:
  """The OOM threshold when ``--max_memory_gb`` is not given: the accelerator's
  ``bytes_limit`` (``device.memory_stats()``), or 80% of RAM on CPU; None if unknown."""
  if machine["platform"] != "cpu":
    return machine.get("device_bytes_limit")
  return 0.8 * machine["host_ram_bytes"] if machine.get("host_ram_bytes") else None


def prepare_cells(labels: list[str], length: int, batch: int, dtype: str,
                  max_memory_bytes: float | None, model_overrides: dict[str, Any] | None,
                  workers: int = 1, log: Callable[[str], None] = print,
                  ) -> dict[str, tuple[dict[str, Any], PreparedCell | None, float]]:
  """:func:`prepare_cell` for every label at one length, in ``workers`` threads.

  XLA compiles with Python's lock released, so on a machine with spare cores the cells of a
  length compile side by side; tracing still takes turns. Logs one line per cell as it is
  done.

  With ``workers > 1`` a cell whose preparation raised is prepared again alone afterwards
  (its record gets ``retried_alone``), so a failure caused by its neighbours, such as device
  memory taken by their autotuning, is not recorded as the cell's result.

  Returns:
    ``{label: (record, cell or None, seconds this cell took to prepare)}``.
  """
  def one(label: str):
    start = time.perf_counter()
    record, cell = prepare_cell(label, length, batch, dtype, max_memory_bytes,
                                model_overrides)
    return record, cell, time.perf_counter() - start

  out = {}

  def finish(label: str, result) -> None:
    out[label] = result
    record, cell, seconds = result
    state = "compiled" if cell is not None else record["status"]
    log(f"  [{len(out)}/{len(labels)} at L={length}] {state} {label} in {seconds:.1f} s")

  if workers > 1 and len(labels) > 1:
    with concurrent.futures.ThreadPoolExecutor(min(workers, len(labels))) as pool:
      futures = {pool.submit(one, label): label for label in labels}
      for future in concurrent.futures.as_completed(futures):
        finish(futures[future], future.result())
    # A compile that raised (say, out of device memory while XLA autotunes beside other
    # compiles) is tried again alone, so side-by-side compiling cannot change a result.
    failed = [label for label in labels if "error_type" in out[label][0]]
    for label in failed:
      del out[label]
      record, cell, seconds = one(label)
      record["retried_alone"] = True
      finish(label, (record, cell, seconds))
  else:
    for label in labels:
      finish(label, one(label))
  return out


def run_benchmark(labels: list[str] | None = None, lengths: list[int] | None = None,
                  batch: int = 32, dtype: str = "float32", steps: int = 10,
                  max_memory_gb: float | None = None, matmul_n: int | None = None,
                  model_overrides: dict[str, Any] | None = None,
                  log: Callable[[str], None] = print,
                  partial_path: str | None = None, resume: bool = False,
                  rounds: int = 3, compile_workers: int = 1,
                  run_seconds: float = 0.0) -> dict[str, Any]:
  """Measures every (variant, length) in this process and returns the JSON payload.

  Lengths run in the outer loop, so a slow spell on a shared machine hits all variants of a
  length alike. At each length every cell is compiled first (:func:`prepare_cells`, in
  ``compile_workers`` threads), then run one after another, so no compile competes with a
  timed run for the host or the device. A config is recorded as ``OOM`` before it runs when
  its train state or its compiled memory estimate exceeds the memory limit; an ``OOM``
  (estimated or raised) at a length marks the variant's longer lengths ``skipped``.

  Args:
    labels: row labels (default :func:`variant_labels`, read from the registry now).
    lengths: input lengths in tokens (default ``DEFAULT_LENGTHS``).
    batch, dtype, steps, rounds: see :func:`measure_config`.
    max_memory_gb: the memory limit in GiB; default :func:`default_memory_limit`.
    matmul_n: matrix side of the matmul-peak measurement.
    model_overrides: extra ``model.*`` fields (tests shrink the model).
    log: progress sink, one line per config.
    partial_path: a JSONL file that gets each record as soon as it is measured; a
      ``{device}`` in it becomes the machine's ``device_slug``. None: no such file.
    resume: reuse the records already in ``partial_path`` that have the same batch, dtype,
      steps and model overrides instead of measuring them again (their ``resumed`` field is
      True), so a killed run goes on where it stopped. False: an old file is deleted first.
      ``run_seconds`` is not compared: each record keeps its own ``steps_per_run``.
    compile_workers: threads that compile a length's cells side by side (1: one by one).
    run_seconds: with > 0, each timed run of a slow cell is cut to about this many seconds
      (:func:`run_cell`); 0: ``steps`` steps every time.

  Returns:
    The ``speed_memory.json`` payload; its schema is in the module docstring.

  Raises:
    ValueError: for an unknown label, a non-positive length, batch, steps, rounds or
      compile_workers.
  """
  run_start = time.perf_counter()
  labels = list(labels or variant_labels())
  lengths = sorted(set(lengths or DEFAULT_LENGTHS))
  for label in labels:
    variant_setup(label, lengths[0])   # fail fast on unknown labels
  if run_seconds < 0:
    raise ValueError(f"--run_seconds must be >= 0 (0: off); got {run_seconds}")
  if min(lengths) <= 0 or min(batch, steps, rounds, compile_workers) <= 0:
    raise ValueError(f"--lengths, --batch, --steps, --rounds and --compile_workers must be "
                     f"positive; got {lengths}, {batch}, {steps}, {rounds}, {compile_workers}")
  log("measuring the machine (matmul peak) ...")
  machine = machine_info(matmul_n)
  peak = machine["matmul_peak"][dtype]["flops_per_s"]
  log(f"device {machine['device_kind']} x{machine['n_devices']} ({machine['platform']}), "
      f"jax {machine['jax']}; {dtype} matmul peak {peak / 1e12:.3g} TFLOP/s")
  max_memory_bytes = max_memory_gb * GIB if max_memory_gb else default_memory_limit(machine)
  results: list[dict[str, Any]] = []
  blocked: dict[str, str] = {}
  key = {"batch": batch, "dtype": dtype, "steps": steps, "rounds": rounds,
         "model_overrides": model_overrides}
  earlier = {}
  if partial_path:
    partial_path = partial_path.replace("{device}", machine["device_slug"])
    os.makedirs(os.path.dirname(os.path.abspath(partial_path)), exist_ok=True)
    if resume:
      earlier = load_partial(partial_path, key)
    elif os.path.exists(partial_path):
      os.remove(partial_path)
  if earlier:
    log(f"resuming: {len(earlier)} records from {partial_path}")
  total, done = len(labels) * len(lengths), 0
  for length in lengths:
    prepared = prepare_cells(
        [label for label in labels if (label, length) not in earlier and label not in blocked],
        length, batch, dtype, max_memory_bytes, model_overrides, compile_workers, log)
    for label in labels:
      done += 1
      if (label, length) in earlier:
        record = {**earlier[(label, length)], "resumed": True}
      elif label in blocked:
        record = {"label": label, "length": length, "batch": batch, "status": "skipped",
                  "reason": blocked[label]}
      else:
        record, cell, prepare_s = prepared[label]
        start = time.perf_counter()
        if cell is not None:
          record = run_cell(cell, steps, rounds, run_seconds)
        record["prepare_wall_s"] = prepare_s
        record["run_wall_s"] = time.perf_counter() - start
        record["wall_s"] = prepare_s + record["run_wall_s"]
        if partial_path:
          with open(partial_path, "a") as f:
            f.write(json.dumps({**key, "record": record}) + "\n")
      if record["status"] == "OOM":
        blocked.setdefault(label, f"OOM at length {length}")
      _add_achieved_flops(record, peak)
      results.append(record)
      log(f"[{done}/{total}] {_progress(record)}")
  add_ratios(results)
  payload = _payload(labels, lengths, batch, dtype, steps, rounds, max_memory_bytes, machine,
                     model_overrides, results)
  payload["settings"].update(compile_workers=compile_workers, run_seconds=run_seconds)
  payload["wall_s"] = time.perf_counter() - run_start
  return payload


def _add_achieved_flops(record: dict[str, Any], peak: float) -> None:
  if record["status"] == "ok" and record.get("flops_per_step_per_device"):
    record["achieved_flops_per_s_per_device"] = (record["flops_per_step_per_device"]
                                                 * record["steps_per_sec"])
    record["achieved_fraction_of_peak"] = record["achieved_flops_per_s_per_device"] / peak


def _payload(labels, lengths, batch, dtype, steps, rounds, max_memory_bytes, machine,
             model_overrides, results) -> dict[str, Any]:
  short, long_ = time_ratio_lengths(lengths)
  ok = {(r["label"], r["length"]): r for r in results if r["status"] == "ok"}
  growth = {label: (ok[(label, long_)]["median_s_per_step"] / ok[(label, short)]
                    ["median_s_per_step"]
                    if (label, short) in ok and (label, long_) in ok and short != long_
                    else None) for label in labels}
  return {
      "schema_version": 2, "benchmark": "speed_memory",
      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "settings": {"labels": labels, "lengths": lengths, "batch": batch, "dtype": dtype,
                   "steps": steps, "rounds": rounds, "max_memory_bytes": max_memory_bytes,
                   "in_process": True, "quick": False,
                   "model": lra_text_config(lengths[0], "softmax", {}, batch, dtype,
                                            model_overrides).model.to_dict(),
                   "vocab_size": BYTE_VOCAB, "num_classes": NUM_CLASSES},
      "machine": machine,
      "memory_metric": MEMORY_METRIC,
      "flops_metric": FLOPS_METRIC,
      "baseline": BASELINE, "results": results,
      "time_ratio": {"short": short, "long": long_, "by_label": growth},
  }


def load_partial(path: str, key: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
  """The records of an interrupted run in ``path`` (JSONL) measured with settings ``key``.

  Returns:
    ``{(label, length): record}``; empty if the file does not exist. Lines written with other
    settings are ignored; a truncated last line (a run killed mid-write) is skipped.
  """
  found: dict[tuple[str, int], dict[str, Any]] = {}
  if not os.path.exists(path):
    return found
  with open(path) as f:
    for line in f:
      try:
        entry = json.loads(line)
      except json.JSONDecodeError:
        continue
      if all(entry.get(k) == v for k, v in key.items()):
        found[(entry["record"]["label"], entry["record"]["length"])] = entry["record"]
  return found


def _progress(record: dict[str, Any]) -> str:
  head = f"{record['label']:<16} L={record['length']:<6}"
  if record["status"] != "ok":
    return f"{head} {record['status']}: {record.get('reason', '')}"
  mem = record.get("memory_bytes")
  mem_text = f"{mem / GIB:.3g} GiB" if mem else "memory n/a"
  return (f"{head} {record['steps_per_sec']:.3g} steps/s, {mem_text}, compile "
          f"{record.get('compile_s', 0):.1f} s, wall {record.get('wall_s', 0):.1f} s")


# ----------------------------------------------------------------------------
# Reports.


def _affinity_note(machine: dict[str, Any]) -> str:
  """``", pinned to N"`` when the process could use fewer CPUs than the machine has."""
  usable = machine.get("cpus_usable")
  return f", pinned to {usable}" if usable and usable < (machine["cpu_count"] or 0) else ""


def _num(x: float) -> str:
  return f"{x:.3g}"


def _cell(record: dict[str, Any] | None, value_key: str, ratio_key: str | None,
          scale: float = 1.0) -> str:
  if record is None:
    return ""
  if record["status"] != "ok":
    return {"skipped": "-"}.get(record["status"], record["status"])
  value = record.get(value_key)
  if value is None:
    return "n/a"
  text = _num(value / scale)
  ratio = record.get(ratio_key) if ratio_key else None
  return f"{text} ({ratio:.2f}x)" if ratio is not None else text


_OLD_FLOPS_METRIC = ("XLA's `cost_analysis()` of the compiled step, which leaves out custom "
                     "calls (cuBLAS, cuDNN) and may count loops once")


def _timing_text(settings: dict[str, Any]) -> str:
  if "rounds" not in settings:   # schema 1: one block per step, a process per cell
    return (f"median of {settings['steps']} timed steps after a warm-up step, one fresh "
            "process per cell" + (" (here: in-process)" if settings["in_process"] else ""))
  steps = f"{settings['steps']}"
  if settings.get("run_seconds"):
    steps = f"up to {steps} (as many as fit in {settings['run_seconds']:g} s)"
  return (f"median over {settings['rounds']} timed runs of {steps} back-to-back "
          "steps (one block per run, batch resident on the device) after a warm-up step, "
          "every cell in one process")


def markdown_report(payload: dict[str, Any]) -> str:
  """The ``speed_memory.md`` text: LRA Table 2 layout (rows = variants, columns = lengths)."""
  settings, machine = payload["settings"], payload["machine"]
  labels, lengths = settings["labels"], settings["lengths"]
  table = {(r["label"], r["length"]): r for r in payload["results"]}
  short, long_ = payload["time_ratio"]["short"], payload["time_ratio"]["long"]
  growth = payload["time_ratio"]["by_label"]
  model = settings["model"]
  peak = machine["matmul_peak"][settings["dtype"]]
  head = "| model | " + " | ".join(str(n) for n in lengths) + " |"
  rule = "|---|" + "---|" * len(lengths)

  def rows(fn) -> list[str]:
    return [f"| `{label}` | " + " | ".join(fn(table.get((label, n))) for n in lengths) + " |"
            for label in labels]

  growth_head = f"t({long_})/t({short})"
  speed = [head[:-1] + f"| {growth_head} |", rule + "---|"]
  for label, line in zip(labels, rows(lambda r: _cell(r, "steps_per_sec",
                                                      "speedup_vs_softmax"))):
    g = growth.get(label)
    speed.append(line + (f" {g:.2f} |" if g is not None else " |"))
  fastest_at = {r["length"]: r["fastest_softmax"] for r in payload["results"]
                if r.get("fastest_softmax")}
  fastest = ["| fastest softmax | " + " | ".join(f"`{fastest_at[n]}`" if n in fastest_at
                                                 else "" for n in lengths) + " |"]

  def vs_fastest(r):
    if r is None or r["status"] != "ok" or r.get("speedup_vs_fastest_softmax") is None:
      return _cell(r, "steps_per_sec", None) if r and r["status"] != "ok" else ""
    mem = r.get("memory_ratio_vs_fastest_softmax")
    return (f"{r['speedup_vs_fastest_softmax']:.2f}x / "
            + (f"{mem:.2f}x" if mem is not None else "n/a"))

  def flops_cell(r):
    if r is None or r["status"] != "ok" or not r.get("achieved_flops_per_s_per_device"):
      return _cell(r, "steps_per_sec", None) if r and r["status"] != "ok" else "n/a"
    return (f"{r['achieved_flops_per_s_per_device'] / 1e12:.3g} "
            f"({100 * r['achieved_fraction_of_peak']:.0f}%)")

  notes = sorted({f"`{r['label']}`: {r['note']}" for r in payload["results"] if r.get("note")})
  lines = [
      "# Speed and memory of the attention variants (LRA Table 2 layout)", "",
      f"Device: {machine['device_kind']} x{machine['n_devices']} ({machine['platform']}, "
      f"{machine['cpu_count']} CPUs{_affinity_note(machine)}); jax {machine['jax']}, "
      f"flax {machine['flax']}. "
      f"Created {payload['created']}.", "",
      f"Model: LRA text classifier, {model['num_layers']} layers, emb {model['emb_dim']}, "
      f"{model['num_heads']} heads, qkv {model['qkv_dim']}, mlp {model['mlp_dim']}, byte "
      f"vocabulary {settings['vocab_size']}, {settings['num_classes']} classes, CLS pooling, "
      f"sinusoidal positions, dropout {model['dropout_rate']}; "
      f"batch {settings['batch']}, "
      f"{settings['dtype']}. Each cell is the full pmapped train step (forward, backward, "
      f"AdamW) on random full-length byte sequences: {_timing_text(settings)}.", "",
      *([f"Command: `{payload['command']}`", ""] if payload.get("command") else []),
      f"## Training steps per second (speed-up vs `{payload['baseline']}`)", "",
      *speed, "",
      f"`{growth_head}`: step time at {long_} tokens over step time at {short}.", "",
      f"## Peak memory, GiB (ratio to `{payload['baseline']}`)", "",
      head, rule, *rows(lambda r: _cell(r, "memory_bytes", "memory_ratio_vs_softmax", GIB)),
      "", f"Memory: {payload['memory_metric']}.", "",
      "## Against the fastest softmax at each length (speed-up / memory ratio)", "",
      head, rule, *fastest, *rows(vs_fastest), "",
      f"## Achieved TFLOP/s per device (share of the measured {settings['dtype']} matmul peak, "
      f"{peak['flops_per_s'] / 1e12:.3g} TFLOP/s at n={peak['n']})", "",
      head, rule, *rows(flops_cell), "",
      "FLOPs per step: " + payload.get("flops_metric", _OLD_FLOPS_METRIC) + ".", "",
      "Cells: `OOM` = out of memory, or estimated over the memory limit before running, "
      "`-` = skipped after an OOM at a shorter length, `error` = see `reason` in "
      "speed_memory.json.",
  ]
  if notes:
    lines += ["", "Variant settings: " + "; ".join(notes) + "."]
  fallbacks = sorted({f"`{r['label']}`: {m}" for r in payload["results"]
                      for m in r.get("fallbacks", ())})
  if fallbacks:
    lines += ["", "Implementation fallbacks logged while compiling (the function is "
              "unchanged): " + "; ".join(fallbacks) + "."]
  return "\n".join(lines) + "\n"


def plot(payload: dict[str, Any], path: str) -> bool:
  """Writes the two log-log panels (steps/s and memory against length) to ``path``.

  Returns:
    False (and writes nothing) when matplotlib is not installed.
  """
  try:
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    import matplotlib.ticker  # noqa: PLC0415
  except ImportError:
    return False
  fig, (ax_speed, ax_mem) = plt.subplots(1, 2, figsize=(12, 4.8))
  markers = "osD^v<>pPX*h"
  for i, label in enumerate(payload["settings"]["labels"]):
    ok = sorted((r["length"], r) for r in payload["results"]
                if r["label"] == label and r["status"] == "ok")
    if not ok:
      continue
    style = dict(linestyle="--" if label.startswith("softmax") else "-",
                 marker=markers[i % len(markers)], label=label)
    ax_speed.plot([n for n, _ in ok], [r["steps_per_sec"] for _, r in ok], **style)
    mem = [(n, r["memory_bytes"] / GIB) for n, r in ok if r.get("memory_bytes")]
    ax_mem.plot([n for n, _ in mem], [m for _, m in mem], **style)
  machine, settings = payload["machine"], payload["settings"]
  for ax, ylabel in ((ax_speed, "training steps / s"), (ax_mem, "peak memory (GiB)")):
    ax.set_xscale("log", base=2)
    ax.set_xticks(settings["lengths"], [str(n) for n in settings["lengths"]])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
  # A CPU run measures no memory: its lines (and so the legend) are on the speed panel alone;
  # a run that measured nothing has no legend.
  legend_ax = ax_mem if ax_mem.lines else ax_speed
  if legend_ax.lines:
    legend_ax.legend(fontsize=8, loc="upper left", ncol=2)
  fig.suptitle(f"LRA text model, batch {settings['batch']}, {settings['dtype']}, "
               f"{machine['device_kind']} x{machine['n_devices']}")
  fig.tight_layout()
  fig.savefig(path, dpi=130)
  plt.close(fig)
  return True


def write_json_and_text(out_dir: str, stem: str, payload: Any, text: str,
                        text_ext: str = "md") -> dict[str, str]:
  """Writes ``<stem>.json`` (``payload``) and ``<stem>.<text_ext>`` (``text``) to ``out_dir``,
  which is created if missing; the benchmarks' common output pair.

  Returns:
    ``{"json": path, text_ext: path}``.
  """
  os.makedirs(out_dir, exist_ok=True)
  paths = {"json": os.path.join(out_dir, f"{stem}.json"),
           text_ext: os.path.join(out_dir, f"{stem}.{text_ext}")}
  with open(paths["json"], "w") as f:
    json.dump(payload, f, indent=2)
  with open(paths[text_ext], "w") as f:
    f.write(text)
  return paths


def write_outputs(payload: dict[str, Any], out_dir: str) -> dict[str, str]:
  """Writes ``speed_memory.json``, ``.md`` and (if matplotlib is present) ``.png``.

  Returns:
    ``{"json", "md", "png"}`` paths (``png`` absent when not written).
  """
  paths = write_json_and_text(out_dir, "speed_memory", payload, markdown_report(payload))
  png = os.path.join(out_dir, "speed_memory.png")
  if plot(payload, png):
    paths["png"] = png
  return paths


# ----------------------------------------------------------------------------
# Command line.


def parse_overrides(items) -> dict[str, Any]:
  """``["last_block_cls_only=true", ...]`` -> ``{"last_block_cls_only": True}`` (JSON values).

  Raises:
    ValueError: for an item without ``=`` (flag --set).
  """
  out = {}
  for item in items:
    field, sep, value = item.partition("=")
    if not sep:
      raise ValueError(f"--set {item!r}: expected FIELD=VALUE")
    try:
      out[field] = json.loads(value)
    except json.JSONDecodeError:
      out[field] = value
  return out


def enable_compilation_cache(path: str) -> None:
  """Turns on JAX's persistent compilation cache in ``path`` (every compile is cached)."""
  xla_cache.enable(path, min_compile_secs=0.0)


def main(argv: list[str] | None = None,
         args: argparse.Namespace | None = None) -> dict[str, Any]:
  """Runs the benchmark from the command line, writes the outputs, prints the tables.

  Args:
    argv: the flags (default ``sys.argv[1:]``).
    args: the flags already parsed (:func:`parse_args`), as the script's own run passes them;
      ``argv`` is then not read.

  Raises:
    SystemExit: (after writing the outputs) if every cell failed or was skipped, so a run
      that measured nothing does not exit 0.
  """
  args = parse_args(argv) if args is None else args
  enable_compilation_cache(args.cache_dir)
  out = args.out or os.path.join(ROOT, "runs", "benchmarks", "{device}")
  partial = os.path.join(out, "speed_memory.partial.jsonl")
  payload = run_benchmark(
      labels=args.variants, lengths=args.lengths or (QUICK_LENGTHS if args.quick
                                                     else DEFAULT_LENGTHS),
      batch=args.batch or (2 if args.quick else 32), dtype=args.dtype,
      steps=args.steps or (2 if args.quick else 10), max_memory_gb=args.max_memory_gb,
      matmul_n=args.matmul_n, model_overrides=parse_overrides(args.set) or None,
      log=lambda line: print(line, file=sys.stderr, flush=True), partial_path=partial,
      resume=args.resume, rounds=args.rounds, compile_workers=args.compile_workers,
      run_seconds=args.run_seconds)
  payload["argv"] = sys.argv if argv is None else [sys.argv[0], *argv]
  payload["command"] = "python " + shlex.join(payload["argv"])
  payload["settings"]["quick"] = args.quick
  out = out.replace("{device}", payload["machine"]["device_slug"])
  paths = write_outputs(payload, out)
  partial = partial.replace("{device}", payload["machine"]["device_slug"])
  if os.path.exists(partial):   # every record is in speed_memory.json now
    os.remove(partial)
  print(markdown_report(payload))
  print("wrote " + ", ".join(paths.values()), file=sys.stderr)
  if "png" not in paths:
    print("matplotlib is not installed: no plot (pip install matplotlib)", file=sys.stderr)
  if not any(r["status"] in ("ok", "OOM") for r in payload["results"]):
    raise SystemExit(f"speed_memory: no cell ran or was found out of memory; the reasons are "
                     f"in {paths['md']}")
  return payload


if __name__ == "__main__":
  main(args=_ARGS)
