"""Speed and memory of every attention variant: LRA Table 2 (Tay et al., 2020), reproduced.

    python benchmarks/speed_memory.py                       # GPU/TPU: lengths 1K..32K, batch 32
    python benchmarks/speed_memory.py --quick               # CPU: lengths 1K, 2K, 4K, batch 2
    python benchmarks/speed_memory.py --quick --variants softmax simple --lengths 256 512 \
        --out /tmp/speed_memory

The model is LRA's byte-level text classifier (``text_classification/configs/base_tc_config.py``
of the LRA code): 4 layers, emb 256, 4 heads, qkv 256, mlp 1024, byte vocabulary 257, 2
classes, CLS pooling, sinusoidal positions, dropout and attention dropout 0.1, AdamW. Every
registered variant of :mod:`simpletron_jax.attention` is measured (``attention.names()`` at run
time), and ``softmax`` twice: ``softmax`` (the LRA einsum form, the ratio baseline) and
``softmax_fused`` (``jax.nn.dot_product_attention``; it has no attention dropout, so that row
runs with ``attention_dropout_rate = 0``). A variant whose module has a ``max_length`` field
(AFT full/local, Linformer, ...) gets ``attention_kwargs.max_length = length + 1`` (CLS).

Per (variant, length), in a fresh subprocess (so GPU peak memory starts from zero and an
out-of-memory crash cannot take the run down):

* steps/s: the real pmapped train step of :mod:`simpletron_jax.train_lib` (forward,
  backward, AdamW update) on random full-length byte sequences. It is compiled
  (``lower().compile()``), run once to warm up, then timed ``--steps`` times with
  ``block_until_ready``; the median step time is reported.
* memory: on GPU/TPU ``device.memory_stats()["peak_bytes_in_use"]`` after the timed steps
  (largest over local devices); on CPU, which keeps no allocator statistics, the compiled
  step's ``memory_analysis()`` estimate per device,
  ``argument + output + temp - alias`` bytes (alias = the donated train state, which is
  both an argument and an output). Both numbers include parameters and optimizer state.
* FLOPs: ``compiled.cost_analysis()["flops"]`` of the per-device step; achieved FLOP/s is
  flops x steps/s and is compared with a timed square ``jnp.dot`` (the machine's matmul
  peak, measured once per run in the benchmark's dtype).

A variant that runs out of memory at length L is recorded as ``OOM`` and skipped at longer
lengths. On CPU a config whose train state or compiled memory estimate (times the number of
local devices, which share host RAM) exceeds ``--max-memory-gb`` (default: 80% of RAM) is
recorded as ``OOM`` without running it.

Writes ``speed_memory.json`` (every raw number, machine, jax version, command line),
``speed_memory.md`` (Table 2 layout) and ``speed_memory.png`` (log-log speed and memory
against length) to ``--out`` (default ``benchmarks/results/<device>/``).

``speed_memory.json`` (schema_version 1):

* ``command``, ``argv``, ``created`` (UTC ISO time), ``benchmark`` = ``"speed_memory"``.
* ``settings``: ``labels``, ``lengths``, ``batch``, ``dtype``, ``steps``, ``quick``,
  ``max_memory_bytes``, ``in_process``, ``timeout_s``, ``model`` (``config.model``),
  ``vocab_size``, ``num_classes``.
* ``machine``: ``platform``, ``device_kind``, ``device_slug``, ``n_devices``, ``cpu_count``,
  ``cpus_usable`` (the process's CPU affinity, e.g. under ``taskset``),
  ``host_ram_bytes``, ``device_bytes_limit``, ``python``, ``jax``, ``jaxlib``, ``flax``,
  ``numpy``, ``os``, ``XLA_FLAGS``, ``XLA_PYTHON_CLIENT_MEM_FRACTION`` and ``matmul_peak``
  ``{dtype: {n, dtype, median_s, flops, flops_per_s}}`` for float32 and bfloat16.
* ``memory_metric`` (what ``memory_bytes`` means), ``baseline`` = ``"softmax"``.
* ``results``: one record per (label, length): ``label``, ``length``, ``batch``, ``status``
  (``ok`` / ``OOM`` / ``skipped`` / ``timeout`` / ``error``), ``reason``, ``wall_s``; once
  built also ``attention``, ``attention_kwargs``, ``note``, ``model``,
  ``train_state_bytes``, ``compile_s``, ``memory_analysis`` (the XLA fields and
  ``estimate_bytes``), ``flops_per_step_per_device``; when ``ok`` also
  ``median_s_per_step``, ``steps_per_sec``, ``step_times_s``, ``memory_bytes``,
  ``memory_source``, ``peak_bytes_in_use``, ``n_devices``, ``final_loss``,
  ``achieved_flops_per_s_per_device``, ``achieved_fraction_of_peak``, ``fastest_softmax``,
  ``speedup_vs_softmax``, ``memory_ratio_vs_softmax``, ``speedup_vs_fastest_softmax``,
  ``memory_ratio_vs_fastest_softmax`` (None where the baseline did not run).
* ``time_ratio``: ``short``, ``long`` (1024 and 4096 when both run, else the shortest and
  longest lengths) and ``by_label`` ``{label: t(long) / t(short) or None}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _path in (ROOT, HERE):
  if _path not in sys.path:
    sys.path.insert(0, _path)

import flax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

import step_time  # noqa: E402
from simpletron_jax import attention, models, train_lib  # noqa: E402

BYTE_VOCAB = 257           # LRA text: byte ids 1..256, 0 = pad
NUM_CLASSES = 2
BASELINE = "softmax"       # einsum softmax: the ratio baseline (LRA's Transformer)
FUSED = "softmax_fused"
SOFTMAX_LABELS = (BASELINE, FUSED)
DEFAULT_LENGTHS = (1024, 2048, 3072, 4096, 8192, 16384, 32768)
QUICK_LENGTHS = (1024, 2048, 4096)
LRA_SHORT, LRA_LONG = 1024, 4096   # LRA Table 2 reports time(4K) / time(1K)
RESULT_MARK = "SPEED_MEMORY_RESULT "
GIB = 2.0 ** 30
STATUSES = ("ok", "OOM", "skipped", "timeout", "error")


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
    A config with every field :mod:`simpletron_jax.train_lib` reads to build the
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
  config.model.dtype = dtype
  for field, value in (model_overrides or {}).items():
    if field not in config.model:
      raise ValueError(f"model_overrides names model.{field}, which the LRA text config "
                       f"lacks; fields: {sorted(config.model)}")
    config.model[field] = value
  return config


def variant_labels() -> list[str]:
  """Every benchmark row label: the registry names, with ``softmax_fused`` after ``softmax``."""
  labels = []
  for name in attention.names():
    labels.append(name)
    if name == BASELINE:
      labels.append(FUSED)
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

  Raises:
    ValueError: for a label that is neither a registered attention nor ``softmax_fused``;
      the message lists the known labels.
  """
  if label == BASELINE:
    return VariantSetup(label, "softmax", {"implementation": "einsum"}, {})
  if label == FUSED:
    return VariantSetup(label, "softmax", {"implementation": "fused"},
                        {"attention_dropout_rate": 0.0},
                        "jax.nn.dot_product_attention; no attention dropout "
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
# Measurements (run inside a worker subprocess, or in-process with --in-process).


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


def measure_config(label: str, length: int, batch: int, dtype: str, steps: int,
                   max_memory_bytes: float | None = None,
                   model_overrides: dict[str, Any] | None = None,
                   in_process: bool = False) -> dict[str, Any]:
  """Steps/s, memory and FLOPs of one (variant, length) in the current process.

  Args:
    label: a row label (:func:`variant_labels`).
    length: input tokens per example, CLS excluded.
    batch: global batch, split over the local devices by ``pmap``.
    dtype: ``model.dtype``.
    steps: timed train steps after the warm-up step.
    max_memory_bytes: if set, a config whose train state or compiled memory estimate
      (times the local device count on CPU, where devices share RAM) exceeds it is recorded
      as ``OOM`` without running.
    model_overrides: extra ``model.*`` fields (tests shrink the model).
    in_process: recorded in ``memory_source``; on accelerators the allocator peak is then
      cumulative over earlier configs of the process.

  Returns:
    A JSON-ready record: ``label``, ``length``, ``batch``, ``status`` (``"ok"``, ``"OOM"``
    or ``"error"``), ``reason``, and for ``ok``: ``median_s_per_step``,
    ``steps_per_sec``, ``step_times_s``, ``compile_s``, ``memory_bytes``,
    ``memory_source``, ``memory_analysis``, ``peak_bytes_in_use``,
    ``train_state_bytes``, ``flops_per_step_per_device``. Never raises for a failing
    config; the failure is the record's ``status`` and ``reason``.
  """
  record: dict[str, Any] = {"label": label, "length": length, "batch": batch,
                            "status": "error", "reason": ""}
  state = compiled = None
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
    device = jax.local_devices()[0]
    on_cpu = device.platform == "cpu"
    host_share = n_dev if on_cpu else 1   # CPU "devices" share one RAM
    model = models.build_classifier(config.model, vocab_size=BYTE_VOCAB,
                                    num_classes=NUM_CLASSES)
    rng = jax.random.PRNGKey(config.seed)
    state_bytes = _tree_bytes(jax.eval_shape(
        lambda: train_lib.create_train_state(config, model, rng)))
    record["train_state_bytes"] = state_bytes
    if max_memory_bytes and state_bytes * host_share > max_memory_bytes:
      record.update(status="OOM", reason=f"train state {state_bytes / GIB:.2f} GiB x "
                    f"{host_share} exceeds --max-memory-gb {max_memory_bytes / GIB:.2f}")
      return record
    state = flax.jax_utils.replicate(train_lib.create_train_state(config, model, rng))
    p_train, _ = train_lib.pmap_steps(model.apply)
    data = step_time.random_batch(np.random.default_rng(0), batch, length, BYTE_VOCAB, n_dev,
                                  NUM_CLASSES)
    start = time.perf_counter()
    compiled = p_train.lower(state, data, jax.random.PRNGKey(0)).compile()
    record["compile_s"] = time.perf_counter() - start
    analysis = _memory_analysis(compiled)
    record["memory_analysis"] = analysis
    record["flops_per_step_per_device"] = _flops(compiled)
    if (max_memory_bytes and analysis is not None
        and analysis["estimate_bytes"] * host_share > max_memory_bytes):
      record.update(status="OOM", reason=f"compiled memory estimate "
                    f"{analysis['estimate_bytes'] / GIB:.2f} GiB x {host_share} exceeds "
                    f"--max-memory-gb {max_memory_bytes / GIB:.2f}")
      return record
    state, sums = compiled(state, data, jax.random.PRNGKey(0))   # warm-up step
    jax.block_until_ready(sums)
    times = []
    for i in range(steps):
      start = time.perf_counter()
      state, sums = compiled(state, data, jax.random.PRNGKey(i + 1))
      jax.block_until_ready(sums)
      times.append(time.perf_counter() - start)
    median = statistics.median(times)
    peaks = [(_memory_stats(d) or {}).get("peak_bytes_in_use") for d in jax.local_devices()]
    peak = max((p for p in peaks if p is not None), default=None)
    if peak is not None and not on_cpu:
      memory, source = int(peak), "peak_bytes_in_use"
      if in_process:
        source += " (in-process: cumulative over earlier configs)"
    elif analysis is not None:
      memory, source = analysis["estimate_bytes"], "memory_analysis"
    else:
      memory, source = None, "unavailable"
    record.update(status="ok", median_s_per_step=median, steps_per_sec=1.0 / median,
                  step_times_s=times, memory_bytes=memory, memory_source=source,
                  peak_bytes_in_use=peak, n_devices=n_dev,
                  final_loss=float(np.asarray(sums["loss"])[0] / np.asarray(sums["count"])[0]))
  except Exception as error:  # noqa: BLE001  (any failure is this config's result)
    record.update(status="OOM" if _is_oom(error) else "error", reason=_first_line(error))
  finally:
    del state, compiled
  return record


# ----------------------------------------------------------------------------
# Orchestration.


def _worker_env() -> dict[str, str]:
  env = dict(os.environ)
  # Let a worker's allocator use most of an accelerator (JAX's default is 75%).
  env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
  return env


def _run_worker(task: dict[str, Any], timeout_s: float | None) -> dict[str, Any]:
  """Runs ``task`` (``{"task": "machine" | "config", ...}``) in a fresh Python process.

  Returns:
    The worker's result dict, or for a config that crashed or hung a record with status
    ``OOM`` (killed by SIGKILL, as the host OOM killer does), ``timeout`` or ``error``.
  """
  cmd = [sys.executable, os.path.abspath(__file__), "--_worker", json.dumps(task)]
  base = {k: task[k] for k in ("label", "length", "batch") if k in task}
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
                          env=_worker_env(), check=False)
  except subprocess.TimeoutExpired:
    return {**base, "status": "timeout", "reason": f"worker exceeded --timeout-s {timeout_s}"}
  for line in reversed(proc.stdout.splitlines()):
    if line.startswith(RESULT_MARK):
      return json.loads(line[len(RESULT_MARK):])
  if proc.returncode in (-9, 137):
    return {**base, "status": "OOM", "reason": "worker killed by SIGKILL (host out of memory?)"}
  tail = " | ".join(proc.stderr.strip().splitlines()[-3:])[-500:]
  if task["task"] == "machine":
    raise RuntimeError(f"the machine-info worker failed (exit {proc.returncode}): {tail}")
  return {**base, "status": "OOM" if "RESOURCE_EXHAUSTED" in proc.stderr else "error",
          "reason": f"worker exit {proc.returncode}: {tail}"}


def _worker_main(task_json: str) -> None:
  task = json.loads(task_json)
  kind = task.pop("task")
  if kind == "machine":
    result = machine_info(task.get("matmul_n"))
  else:
    result = measure_config(**task)
  print(RESULT_MARK + json.dumps(result), flush=True)


def add_ratios(results: list[dict[str, Any]]) -> None:
  """Adds, in place, each ok record's ratios to the softmax rows at the same length.

  ``speedup_vs_softmax`` = steps/s over einsum softmax's, ``memory_ratio_vs_softmax`` =
  memory over its memory; ``*_vs_fastest_softmax`` use whichever of ``softmax`` and
  ``softmax_fused`` has the most steps/s at that length (named in ``fastest_softmax``).
  A ratio is None where its baseline did not run.
  """
  by_key = {(r["label"], r["length"]): r for r in results if r["status"] == "ok"}
  for record in results:
    if record["status"] != "ok":
      continue
    length = record["length"]
    base = by_key.get((BASELINE, length))
    softmaxes = [by_key[(s, length)] for s in SOFTMAX_LABELS if (s, length) in by_key]
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


def run_benchmark(labels: list[str] | None = None, lengths: list[int] | None = None,
                  batch: int = 32, dtype: str = "float32", steps: int = 10,
                  max_memory_gb: float | None = None, in_process: bool = False,
                  timeout_s: float | None = None, matmul_n: int | None = None,
                  model_overrides: dict[str, Any] | None = None,
                  log: Callable[[str], None] = print,
                  partial_path: str | None = None, resume: bool = False) -> dict[str, Any]:
  """Measures every (variant, length) and returns the ``speed_memory.json`` payload.

  Lengths run in the outer loop, so a slow spell on a shared machine hits all variants of a
  length alike. Once a variant is ``OOM`` (or ``timeout``) at a length, its longer lengths
  are recorded as ``skipped``.

  Args:
    labels: row labels (default :func:`variant_labels`, read from the registry now).
    lengths: input lengths in tokens (default ``DEFAULT_LENGTHS``).
    batch, dtype, steps: see :func:`measure_config`.
    max_memory_gb: CPU guard (see :func:`measure_config`); default on CPU: 80% of RAM.
    in_process: measure in this process instead of one subprocess per config (tests; GPU
      memory is then cumulative and an OOM may leave the process unstable).
    timeout_s: per-config wall-clock limit of a subprocess (None: no limit).
    matmul_n: matrix side of the matmul-peak measurement.
    model_overrides: extra ``model.*`` fields (tests shrink the model).
    log: progress sink, one line per config.
    partial_path: a JSONL file that gets each record as soon as it is measured; a
      ``{device}`` in it becomes the machine's ``device_slug``. None: no such file.
    resume: reuse the records already in ``partial_path`` that have the same batch, dtype,
      steps and model overrides instead of measuring them again (their ``resumed`` field is
      True), so a killed run goes on where it stopped. False: an old file is deleted first.

  Returns:
    The ``speed_memory.json`` payload; its schema is in the module docstring.

  Raises:
    ValueError: for an unknown label, a non-positive length, batch or steps.
  """
  labels = list(labels or variant_labels())
  lengths = sorted(set(lengths or DEFAULT_LENGTHS))
  for label in labels:
    variant_setup(label, lengths[0])   # fail fast on unknown labels
  if min(lengths) <= 0 or batch <= 0 or steps <= 0:
    raise ValueError(f"--lengths, --batch and --steps must be positive; got {lengths}, "
                     f"{batch}, {steps}")
  log("measuring the machine (matmul peak) ...")
  machine = (machine_info(matmul_n) if in_process
             else _run_worker({"task": "machine", "matmul_n": matmul_n}, None))
  peak = machine["matmul_peak"][dtype]["flops_per_s"]
  log(f"device {machine['device_kind']} x{machine['n_devices']} ({machine['platform']}), "
      f"jax {machine['jax']}; {dtype} matmul peak {peak / 1e12:.3g} TFLOP/s")
  max_memory_bytes = max_memory_gb * GIB if max_memory_gb else None
  if max_memory_bytes is None and machine["platform"] == "cpu" and machine["host_ram_bytes"]:
    max_memory_bytes = 0.8 * machine["host_ram_bytes"]
  results: list[dict[str, Any]] = []
  blocked: dict[str, str] = {}
  key = {"batch": batch, "dtype": dtype, "steps": steps, "model_overrides": model_overrides}
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
    for label in labels:
      done += 1
      if (label, length) in earlier:
        record = {**earlier[(label, length)], "resumed": True}
        if record["status"] in ("OOM", "timeout"):
          blocked[label] = f"{record['status']} at length {length}"
      elif label in blocked:
        record = {"label": label, "length": length, "batch": batch, "status": "skipped",
                  "reason": blocked[label]}
      else:
        task = {"label": label, "length": length, "batch": batch, "dtype": dtype,
                "steps": steps, "max_memory_bytes": max_memory_bytes,
                "model_overrides": model_overrides}
        start = time.perf_counter()
        record = (measure_config(**task, in_process=True) if in_process
                  else _run_worker({"task": "config", **task}, timeout_s))
        record["wall_s"] = time.perf_counter() - start
        if record["status"] in ("OOM", "timeout"):
          blocked[label] = f"{record['status']} at length {length}"
        if partial_path:
          with open(partial_path, "a") as f:
            f.write(json.dumps({**key, "record": record}) + "\n")
      if record["status"] == "ok" and record.get("flops_per_step_per_device"):
        record["achieved_flops_per_s_per_device"] = (record["flops_per_step_per_device"]
                                                     * record["steps_per_sec"])
        record["achieved_fraction_of_peak"] = record["achieved_flops_per_s_per_device"] / peak
      results.append(record)
      log(f"[{done}/{total}] {_progress(record)}")
  add_ratios(results)
  short, long_ = time_ratio_lengths(lengths)
  ok = {(r["label"], r["length"]): r for r in results if r["status"] == "ok"}
  growth = {label: (ok[(label, long_)]["median_s_per_step"] / ok[(label, short)]
                    ["median_s_per_step"]
                    if (label, short) in ok and (label, long_) in ok and short != long_
                    else None) for label in labels}
  return {
      "schema_version": 1, "benchmark": "speed_memory",
      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "settings": {"labels": labels, "lengths": lengths, "batch": batch, "dtype": dtype,
                   "steps": steps, "max_memory_bytes": max_memory_bytes,
                   "in_process": in_process, "timeout_s": timeout_s, "quick": False,
                   "model": lra_text_config(lengths[0], "softmax", {}, batch, dtype,
                                            model_overrides).model.to_dict(),
                   "vocab_size": BYTE_VOCAB, "num_classes": NUM_CLASSES},
      "machine": machine,
      "memory_metric": (
          "accelerators: max over local devices of device.memory_stats()['peak_bytes_in_use'] "
          "after the timed steps (fresh process per config); CPU: compiled.memory_analysis() "
          "argument + output + temp - alias bytes per device"),
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
      f"sinusoidal positions, dropout {model['dropout_rate']}; batch {settings['batch']}, "
      f"{settings['dtype']}. Each cell is the full pmapped train step (forward, backward, "
      f"AdamW) on random full-length byte sequences: median of {settings['steps']} timed "
      "steps after a warm-up step, one fresh process per cell"
      + (" (here: in-process)" if settings["in_process"] else "") + ".", "",
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
      "FLOPs per step are XLA's `cost_analysis()` of the compiled step; XLA does not count "
      "custom calls (e.g. cuDNN fused attention), so `softmax_fused` on GPU is undercounted, "
      "and loops (`while`/`scan`) may be counted once.", "",
      "Cells: `OOM` = out of memory (or over `--max-memory-gb` on CPU), `-` = skipped after "
      "an OOM or timeout at a shorter length, `error` = see `reason` in speed_memory.json.",
  ]
  if notes:
    lines += ["", "Variant settings: " + "; ".join(notes) + "."]
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
  ax_mem.legend(fontsize=8, loc="upper left", ncol=2)
  fig.suptitle(f"LRA text model, batch {settings['batch']}, {settings['dtype']}, "
               f"{machine['device_kind']} x{machine['n_devices']}")
  fig.tight_layout()
  fig.savefig(path, dpi=130)
  plt.close(fig)
  return True


def write_outputs(payload: dict[str, Any], out_dir: str) -> dict[str, str]:
  """Writes ``speed_memory.json``, ``.md`` and (if matplotlib is present) ``.png``.

  Returns:
    ``{"json", "md", "png"}`` paths (``png`` absent when not written).
  """
  os.makedirs(out_dir, exist_ok=True)
  paths = {"json": os.path.join(out_dir, "speed_memory.json"),
           "md": os.path.join(out_dir, "speed_memory.md")}
  with open(paths["json"], "w") as f:
    json.dump(payload, f, indent=2)
  with open(paths["md"], "w") as f:
    f.write(markdown_report(payload))
  png = os.path.join(out_dir, "speed_memory.png")
  if plot(payload, png):
    paths["png"] = png
  return paths


# ----------------------------------------------------------------------------
# Command line.


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  """The command-line flags (see the module docstring)."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
  parser.add_argument("--variants", nargs="+", default=None,
                      help="row labels (default: every registered attention plus "
                      "softmax_fused)")
  parser.add_argument("--lengths", nargs="+", type=int, default=None,
                      help=f"input lengths (default {' '.join(map(str, DEFAULT_LENGTHS))}; "
                      f"--quick: {' '.join(map(str, QUICK_LENGTHS))})")
  parser.add_argument("--batch", type=int, default=None, help="global batch (default 32; "
                      "--quick: 2)")
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                      help="model.dtype")
  parser.add_argument("--steps", type=int, default=None,
                      help="timed steps per cell (default 10; --quick: 5)")
  parser.add_argument("--quick", action="store_true",
                      help="CPU mode: batch 2, lengths 1K, 2K and 4K, 5 steps (every variant: "
                      "about an hour on one core; a few variants: minutes)")
  parser.add_argument("--out", default=None,
                      help="results folder (default benchmarks/results/<device>/)")
  parser.add_argument("--max-memory-gb", type=float, default=None,
                      help="record OOM for a config whose train state or compiled memory "
                      "estimate exceeds this (default on CPU: 80%% of RAM)")
  parser.add_argument("--timeout-s", type=float, default=None,
                      help="per-cell wall-clock limit; a cell over it is 'timeout' and the "
                      "variant's longer lengths are skipped")
  parser.add_argument("--matmul-n", type=int, default=None,
                      help="matrix side for the matmul peak (default 8192; CPU 1024)")
  parser.add_argument("--in-process", action="store_true",
                      help="no subprocess per cell (GPU memory becomes cumulative)")
  parser.add_argument("--resume", action="store_true",
                      help="reuse the records of an interrupted run with the same settings "
                      "(<out>/speed_memory.partial.jsonl)")
  parser.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
  return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
  """Runs the benchmark from the command line, writes the outputs, prints the tables."""
  args = parse_args(argv)
  if args._worker is not None:
    _worker_main(args._worker)
    return {}
  out = args.out or os.path.join(ROOT, "benchmarks", "results", "{device}")
  partial = os.path.join(out, "speed_memory.partial.jsonl")
  payload = run_benchmark(
      labels=args.variants, lengths=args.lengths or (QUICK_LENGTHS if args.quick
                                                     else DEFAULT_LENGTHS),
      batch=args.batch or (2 if args.quick else 32), dtype=args.dtype,
      steps=args.steps or (5 if args.quick else 10), max_memory_gb=args.max_memory_gb,
      in_process=args.in_process, timeout_s=args.timeout_s, matmul_n=args.matmul_n,
      log=lambda line: print(line, file=sys.stderr, flush=True), partial_path=partial,
      resume=args.resume)
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
  return payload


if __name__ == "__main__":
  main()
