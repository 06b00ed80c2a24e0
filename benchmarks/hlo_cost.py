"""A memory-traffic model of the compiled train step, for a GPU this machine may not have.

    # H100 SXM, compiled here without a GPU (needs the CUDA plugin of the installed jaxlib):
    python -m venv --system-site-packages /tmp/gpu-aot
    /tmp/gpu-aot/bin/pip install --no-deps "jax-cuda12-plugin==$(python -c \
        'import jaxlib; print(jaxlib.__version__)')" "jax-cuda12-pjrt==$(python -c \
        'import jaxlib; print(jaxlib.__version__)')"
    JAX_PLATFORMS=cpu /tmp/gpu-aot/bin/python benchmarks/hlo_cost.py --target h100 \
        --lengths 4096 --specs simple 'simple+last_block_cls_only=true' --out /tmp/hlo_cost
    # The local backend (a CPU here, or the GPU of the machine it runs on):
    python benchmarks/hlo_cost.py --target local --specs simple --lengths 1024 --out ...

A spec is a ``speed_memory.py`` row label (the LRA text model of that script) or a config
file as ``step_time.py`` takes it (``configs/listops/simple.py[:variant][,field=value...]``),
followed by ``+FIELD=VALUE`` ``model.*`` overrides (values JSON, else strings), e.g.
``simple+attention_kwargs={"block_diagonal":true}``.

For each spec and length the script compiles the train step (forward, backward and AdamW on
``--batch`` full-length examples, 32 by default, in ``--dtype``) and reads the optimized
HLO. Each kernel of the entry computation (a fusion, a cuBLAS call, a copy) is charged

* ``bytes``: the sizes of its operands and results, where a fusion parameter used only
  through slices counts the slices; and
* ``flops``: ``2 * output elements * contracted elements`` for a matmul (a cuBLAS custom
  call, or a fusion holding a ``dot``);

and the model's time for it is ``max(bytes / bandwidth, flops / matmul_peak)``. This is a
lower bound per kernel: it ignores caches (L2 can hold a layer's smaller tensors), launch
gaps, and kernels that are bound by arithmetic other than matmuls (the threefry rounds of
dropout's random bits). Its use is to compare programs, not to predict seconds: which kernels
move the bytes, and by how much an option changes them, before the option is timed on a GPU.

``--target h100`` compiles for an NVIDIA H100 SXM without one (XLA's deviceless compilation
through the CUDA PJRT plugin's topology with a target description; :func:`h100_target_config`
gives the device facts it needs). Without a device XLA cannot autotune, so Triton GEMM fusions
are turned off and every matmul goes to cuBLAS; a real GPU may pick Triton for a few small
ones. Kernel names match the JAX profiler's (``benchmarks/profile_step.py``) when the jaxlib
versions match.

Writes ``hlo_cost.json`` (every kernel of every cell) and ``hlo_cost.md`` (totals, shares by
kind and by model part, and the largest kernels) to ``--out``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shlex
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from simpletron_jax.runtime import cli  # noqa: E402

# H100 SXM5 80GB: 132 SMs at 1.98 GHz, 3.35 TB/s HBM3, 50 MiB L2, 228 KiB of shared memory
# per SM (227 KiB to one block), compute capability 9.0 (NVIDIA's H100 datasheet and CUDA
# occupancy tables). The matmul peak is the one speed_memory.py measured on our H100
# (benchmarks/results/nvidia-h100-80gb-hbm3/README.md: 707 TFLOP/s, bfloat16, n = 8192).
H100 = {
    "name": "NVIDIA H100 80GB HBM3", "core_count": 132, "clock_rate_ghz": 1.98,
    "memory_bandwidth": 3_352_320_000_000, "l2_cache_size": 50 * 2**20,
    "device_memory_size": 84_942_979_072, "shared_memory_per_core": 228 * 1024,
    "shared_memory_per_block_optin": 227 * 1024, "compute_capability": (9, 0),
}
H100_MATMUL_PEAK = 707e12
HBM_EFFICIENCY = 0.8   # the share of the bandwidth a streaming kernel reaches (model input)
DETAIL_MIN_S = 1e-5    # kernels modelled at 10 us or more are listed one by one in the JSON

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
                "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
                "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1}
_ARRAY = re.compile(r"\b(pred|[suf]\d+|bf16|c64|f8e4m3fn|f8e5m2)\[([\d,]*)\]")
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s+\(.*\{\s*$")
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][\w\-]*)\((.*?)\)(.*)$")
_FREE = {"parameter", "constant", "bitcast", "get-tuple-element", "tuple", "partition-id",
         "replica-id", "after-all", "opt-barrier"}
_SLICES = {"slice", "dynamic-slice"}
# Model parts, from a kernel's source op (the op_name metadata of its root); first match wins.
PARTS = (("dropout", re.compile(r"Dropout|dropout", re.I)),
         ("layer norm", re.compile(r"LayerNorm|encoder_norm")),
         ("attention projections", re.compile(r"attention/(query|key|value|out)/")),
         ("attention", re.compile(r"/attention/")),
         ("MLP", re.compile(r"MlpBlock")),
         ("embedding and head", re.compile(r"embed|posembed|head_|/split|concatenate|logits")),
         ("other model ops", re.compile(r"ClassificationEncoder")))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  """The command line (see the module docstring)."""
  parser = cli.ArgumentParser(prog="hlo_cost.py", description=__doc__.split("\n", maxsplit=1)[0])
  parser.add_argument("--specs", nargs="+", default=["simple"],
                      help="LABEL[+FIELD=VALUE...]: a speed_memory.py row or a config file "
                      "spec, and model overrides")
  parser.add_argument("--lengths", nargs="+", type=int, default=[4096])
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--target", choices=("h100", "local"), default="h100")
  parser.add_argument("--bandwidth", type=float, default=None,
                      help="bytes/s a streaming kernel reaches (default: 0.8 x the H100's "
                      "3.35e12; give the local device's with --target local)")
  parser.add_argument("--matmul_peak", type=float, default=H100_MATMUL_PEAK,
                      help="matmul FLOP/s (default: the H100's measured bfloat16 peak)")
  parser.add_argument("--top", type=int, default=12, help="largest kernels listed per cell")
  parser.add_argument("--out", required=True)
  return parser.parse_args(argv)


if __name__ == "__main__":
  # The flags first: --help and a bad invocation end here, before the imports below load JAX.
  _ARGS = parse_args()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec  # noqa: E402

import speed_memory as sm  # noqa: E402
import step_time  # noqa: E402
from simpletron_jax.model import encoders  # noqa: E402
from simpletron_jax.model.attention import softmax as softmax_attention  # noqa: E402
from simpletron_jax.train import run_config, steps, train_state  # noqa: E402


def h100_target_config(device: dict[str, Any] | None = None) -> str:
  """XLA's ``GpuTargetConfigProto`` (text format) for compiling without the GPU.

  Args:
    device: the facts of :data:`H100` (the default), or another NVIDIA GPU's.

  Returns:
    The text proto that ``jax.experimental.topologies.get_topology_desc(platform="cuda",
    target_config=...)`` takes: the device's limits, SM count, clocks, memory, bandwidth
    and compute capability, and the cuDNN and CUDA runtime versions XLA assumes.
  """
  d = dict(H100, **(device or {}))
  major, minor = d["compute_capability"]
  info = {"threads_per_block_limit": 1024, "threads_per_warp": 32,
          "shared_memory_per_block": 48 * 1024,
          "shared_memory_per_core": d["shared_memory_per_core"],
          "threads_per_core_limit": 2048, "core_count": d["core_count"], "fpus_per_core": 128,
          "block_dim_limit_x": 2**31 - 1, "block_dim_limit_y": 65535, "block_dim_limit_z": 65535,
          "memory_bandwidth": d["memory_bandwidth"], "l2_cache_size": d["l2_cache_size"],
          "clock_rate_ghz": d["clock_rate_ghz"], "device_memory_size": d["device_memory_size"],
          "shared_memory_per_block_optin": d["shared_memory_per_block_optin"],
          "registers_per_core_limit": 65536, "registers_per_block_limit": 65536}
  lines = ["gpu_device_info {"] + [f"  {k}: {v}" for k, v in info.items()]
  lines += [f"  cuda_compute_capability {{ major: {major} minor: {minor} }}", "}",
            'platform_name: "CUDA"', "dnn_version_info { major: 9 minor: 10 }",
            "runtime_version { major: 12 minor: 8 }",
            f'device_description_str: "{d["name"]}"']
  return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------
# Reading optimized HLO text.


def array_bytes(shape_text: str) -> int:
  """Bytes of every array shape in ``shape_text`` (a tuple shape sums its elements).

  ``"(bf16[32,4097,1024]{2,1,0}, pred[2]{0})"`` -> ``32 * 4097 * 1024 * 2 + 2``.
  """
  total = 0
  for dtype, dims in _ARRAY.findall(shape_text):
    total += int(np.prod([int(d) for d in dims.split(",") if d], dtype=np.int64)) \
        * _DTYPE_BYTES[dtype]
  return total


def _first_array(shape_text: str) -> tuple[str, list[int]]:
  dtype, dims = _ARRAY.findall(shape_text)[0]
  return dtype, [int(d) for d in dims.split(",") if d]


def parse_module(hlo_text: str) -> tuple[dict[str, list[dict[str, Any]]], str]:
  """The computations of an HLO module's text.

  Returns:
    ``(computations, entry)``: ``{name: [instruction, ...]}`` in text order, each
    instruction ``{"name", "shape", "op", "operands" (names), "args" (the text between
    the parentheses), "attrs" (the rest of the line)}``, and the entry computation's name.

  Raises:
    ValueError: if the text has no ENTRY computation.
  """
  computations: dict[str, list[dict[str, Any]]] = {}
  entry, current = None, None
  for line in hlo_text.splitlines():
    start = _COMPUTATION.match(line)
    if start:
      current = start.group(2)
      computations[current] = []
      if start.group(1):
        entry = current
      continue
    found = _INSTRUCTION.match(line) if current is not None else None
    if found:
      name, shape, op, operands, attrs = found.groups()
      computations[current].append({"name": name, "shape": shape, "op": op,
                                    "operands": re.findall(r"%([\w.\-]+)", operands),
                                    "args": operands, "attrs": attrs})
  if entry is None:
    raise ValueError("no ENTRY computation in the HLO text (expected compiled.as_text())")
  return computations, entry


def _dot_flops(shape: str, attrs: str, lhs_shape: str) -> int:
  """``2 * output elements * contracted elements`` of a ``dot`` or a cuBLAS gemm call."""
  _, out_dims = _first_array(shape)
  _, lhs_dims = _first_array(lhs_shape)
  found = (re.search(r"lhs_contracting_dims=\{([\d,]*)\}", attrs)
           or re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', attrs))
  contracted = [int(d) for d in re.findall(r"\d+", found.group(1))] if found else []
  return 2 * int(np.prod(out_dims, dtype=np.int64)) \
      * int(np.prod([lhs_dims[d] for d in contracted], dtype=np.int64))


def _fusion_parameter_bytes(body: list[dict[str, Any]]) -> dict[int, int]:
  """Bytes read of fusion parameters used only through slices: ``{parameter index: bytes}``."""
  users: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
  for inst in body:
    for operand in inst["operands"]:
      users[operand].append(inst)
  out = {}
  for inst in body:
    uses = users[inst["name"]]
    if inst["op"] == "parameter" and uses and all(u["op"] in _SLICES for u in uses):
      out[int(inst["args"])] = sum(array_bytes(u["shape"]) for u in uses)
  return out


def kind_of(inst: dict[str, Any], flops: int) -> str:
  """``matmul``, ``copy/transpose``, ``reduction``, ``elementwise``, ``custom call`` or the
  opcode, from the kernel's name, opcode and FLOPs."""
  name = inst["name"]
  if flops:
    return "matmul"
  if inst["op"] in ("copy", "transpose") or "transpose" in name or name.startswith("copy"):
    return "copy/transpose"
  if inst["op"] == "reduce" or "reduce" in name:
    return "reduction"
  if inst["op"] == "fusion":
    return "elementwise"
  if inst["op"] == "custom-call":
    return "custom call"
  return inst["op"]


def part_of(op_name: str) -> str:
  """The model part (:data:`PARTS`) a kernel's source op belongs to, else ``optimizer and
  other``."""
  for part, pattern in PARTS:
    if pattern.search(op_name):
      return part
  return "optimizer and other"


def kernel_costs(hlo_text: str, bandwidth: float, matmul_peak: float) -> list[dict[str, Any]]:
  """The modelled cost of every kernel of the entry computation.

  Args:
    hlo_text: ``compiled.as_text()`` (optimized, scheduled HLO).
    bandwidth: memory bandwidth in bytes/s (already scaled by any efficiency).
    matmul_peak: matmul FLOP/s.

  Returns:
    ``[{"name", "op", "kind", "part", "bytes", "flops", "model_s", "shape", "op_name"}]`` in
    program order; ``model_s = max(bytes / bandwidth, flops / matmul_peak)``. Parameters,
    constants, bitcasts and tuple plumbing are free and left out.

  Raises:
    ValueError: from :func:`parse_module`, or if the entry computation has no kernel (a
      model of 0 ms would otherwise pass for a result).
  """
  computations, entry = parse_module(hlo_text)
  shapes = {inst["name"]: inst["shape"] for body in computations.values() for inst in body}
  rows = []
  for inst in computations[entry]:
    if inst["op"] in _FREE:
      continue
    called = re.search(r"calls=%?([\w.\-]+)", inst["attrs"])
    body = computations.get(called.group(1), []) if called else []
    sliced = _fusion_parameter_bytes(body) if inst["op"] == "fusion" else {}
    read = sum(sliced.get(i, array_bytes(shapes.get(o, ""))) for i, o in
               enumerate(inst["operands"]))
    written = array_bytes(inst["shape"])
    flops = 0
    if inst["op"] == "custom-call" and re.search(r"gemm|matmul", inst["attrs"]):
      flops = _dot_flops(inst["shape"], inst["attrs"], shapes[inst["operands"][0]])
      written = array_bytes(_ARRAY.search(inst["shape"]).group(0))   # not the workspace
    elif inst["op"] == "dot":
      flops = _dot_flops(inst["shape"], inst["attrs"], shapes[inst["operands"][0]])
    else:
      for sub in body:
        if sub["op"] == "dot":
          flops += _dot_flops(sub["shape"], sub["attrs"], shapes[sub["operands"][0]])
    op_name = re.search(r'op_name="([^"]*)"', inst["attrs"])
    op_name = op_name.group(1) if op_name else ""
    rows.append({"name": inst["name"], "op": inst["op"], "kind": kind_of(inst, flops),
                 "part": part_of(op_name), "bytes": read + written, "flops": flops,
                 "model_s": max((read + written) / bandwidth, flops / matmul_peak),
                 "shape": inst["shape"].split(", metadata")[0][:120], "op_name": op_name})
  if not rows:
    raise ValueError(f"no kernel in the entry computation {entry!r} of the HLO text: only "
                     "parameters and tuple plumbing, or lines this parser does not read")
  return rows


def summarize(rows: list[dict[str, Any]], top: int = 12) -> dict[str, Any]:
  """Totals of :func:`kernel_costs`' rows: ``{"model_ms", "bytes", "flops", "kernels",
  "by_kind": {kind: ms}, "by_part": {part: ms}, "top": [the ``top`` slowest rows]}``."""
  by_kind: dict[str, float] = collections.Counter()
  by_part: dict[str, float] = collections.Counter()
  for r in rows:
    by_kind[r["kind"]] += r["model_s"] * 1e3
    by_part[r["part"]] += r["model_s"] * 1e3
  return {"model_ms": sum(r["model_s"] for r in rows) * 1e3,
          "bytes": sum(r["bytes"] for r in rows), "flops": sum(r["flops"] for r in rows),
          "kernels": len(rows), "by_kind": dict(by_kind.most_common()),
          "by_part": dict(by_part.most_common()),
          "top": sorted(rows, key=lambda r: -r["model_s"])[:top]}


# ----------------------------------------------------------------------------
# Compiling the benchmark's train step.


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
  """``"simple+last_block_cls_only=true"`` -> ``("simple", {"last_block_cls_only": True})``.

  Raises:
    ValueError: for an override without ``=`` (flag --specs).
  """
  label, *items = spec.split("+")
  try:
    return label, sm.parse_overrides(items)
  except ValueError as error:
    raise ValueError(f"--specs {spec!r}: {error}") from None


def target_mesh(target: str) -> jax.sharding.Mesh:
  """A one-device mesh over axis :data:`steps.AXIS`: the local backend's first device
  (``"local"``), or an abstract H100 (``"h100"``).

  Raises:
    SystemExit: for ``"h100"`` when the CUDA PJRT plugin is not installed.
  """
  if target == "local":
    return jax.sharding.Mesh(np.array(jax.local_devices()[:1]), (steps.AXIS,))
  from jax.experimental import topologies  # noqa: PLC0415
  try:
    topology = topologies.get_topology_desc(platform="cuda", topology="1x1x1",
                                            target_config=h100_target_config())
  except Exception as error:  # noqa: BLE001  (missing plugin or unsupported jaxlib)
    raise SystemExit(
        f"--target h100: no CUDA topology ({str(error).splitlines()[0][:200]}). Install the "
        f"CUDA plugin of this jaxlib ({jax.lib.__version__}) beside it, as this script's "
        "docstring shows") from None
  return topologies.make_mesh(topology, (1,), (steps.AXIS,))


def cell_config(label: str, length: int, batch: int, dtype: str, overrides: dict[str, Any]):
  """The config of one cell: a ``speed_memory.py`` row (the LRA text model at ``length``), or
  a config file spec ``path.py[:variant][,dotted.field=value...]`` as ``step_time.py`` reads
  it, with ``model.dtype`` and ``batch_size`` set from ``dtype`` and ``batch``.

  Returns:
    ``(config, vocab_size, num_classes)``.

  Raises:
    ValueError: for an unknown row, a bad override, or ``length`` over ``model.max_length``.
  """
  if ".py" not in label:
    setup = sm.variant_setup(label, length)
    config = sm.lra_text_config(length, setup.attention, setup.attention_kwargs, batch, dtype,
                                {**setup.model_overrides, **overrides})
    return config, sm.BYTE_VOCAB, sm.NUM_CLASSES
  config = step_time.load_config(label)
  config.batch_size, config.model.dtype = batch, dtype
  for field, value in overrides.items():
    if field not in config.model:
      raise ValueError(f"{label}: +{field}= is not a model field of that config")
    config.model[field] = value
  if length > config.model.max_length:
    raise ValueError(f"{label}: length {length} > model.max_length "
                     f"{config.model.max_length}")
  return config, 16, 10


def compile_step(label: str, length: int, batch: int, dtype: str, overrides: dict[str, Any],
                 mesh: jax.sharding.Mesh, target: str) -> str:
  """The optimized HLO text of the train step for one cell (:func:`cell_config`).

  The step is :func:`simpletron_jax.train.steps.train_step` on one device, as
  ``speed_memory.py``'s pmapped step runs it (under ``shard_map`` over ``mesh`` here, so that
  it can be compiled for an abstract device), on ``batch`` full-length examples. The state
  is donated.

  Raises:
    ValueError: from :func:`cell_config`.
  """
  config, vocab, classes = cell_config(label, length, batch, dtype, overrides)
  model = encoders.build_classifier(config.model, vocab_size=vocab, num_classes=classes)
  state_shapes = jax.eval_shape(lambda r: train_state.create_train_state(
      run_config.TrainConfig.from_config_dict(config), model, r, config.model.max_length),
                                jax.random.PRNGKey(0))

  def step(state, data, rng):
    first = lambda tree: jax.tree_util.tree_map(lambda x: x[0], tree)  # noqa: E731
    new_state, metrics = steps.train_step(first(state), first(data), rng)
    return jax.tree_util.tree_map(lambda x: x[None], (new_state, metrics))

  axis = PartitionSpec(steps.AXIS)
  mapped = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(axis, axis, PartitionSpec()),
                                 out_specs=axis), donate_argnums=0)
  sharded = jax.sharding.NamedSharding(mesh, axis)
  state = jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct((1, *x.shape), x.dtype, sharding=sharded), state_shapes)
  host = step_time.random_batch(np.random.default_rng(0), batch, length, vocab, 1, classes)
  data = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharded) for k, v in host.items()}
  rng = jax.ShapeDtypeStruct((2,), jnp.uint32,
                             sharding=jax.sharding.NamedSharding(mesh, PartitionSpec()))
  # Without a device XLA cannot autotune Triton GEMM tiles (and fails on the defaults).
  options = {"xla_gpu_enable_triton_gemm": False} if target == "h100" else None
  return mapped.lower(state, data, rng).compile(compiler_options=options).as_text()


def measure(spec: str, length: int, batch: int, dtype: str, mesh, target: str,
            bandwidth: float, matmul_peak: float, top: int) -> dict[str, Any]:
  """One cell: compiles it and models its kernels.

  Returns:
    ``{"spec", "label", "overrides", "length", "status" ("ok" or "error"), "reason",
    "compile_s", "fallbacks"}`` plus :func:`summarize`'s fields (over every kernel) and
    ``"kernels_detail"`` (the rows of :data:`DETAIL_MIN_S` or more) when it compiled. ``fallbacks`` lists the softmax module's fallback reasons:
    compiled without a GPU, ``softmax_flash`` falls back to XLA (cuDNN is chosen when the
    step is traced on a GPU). Never raises for a failing config.
  """
  label, overrides = parse_spec(spec)
  record = {"spec": spec, "label": label, "overrides": overrides, "length": length,
            "status": "error", "reason": ""}
  try:
    start = time.perf_counter()
    with softmax_attention.recording_fallbacks() as reasons:
      text = compile_step(label, length, batch, dtype, overrides, mesh, target)
    record["compile_s"] = round(time.perf_counter() - start, 2)
    record["fallbacks"] = sorted(set(reasons))
    rows = kernel_costs(text, bandwidth, matmul_peak)
  except Exception as error:  # noqa: BLE001  (any failure is this cell's result)
    record["reason"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
    return record
  record.update(status="ok", **summarize(rows, top),
                kernels_detail=[dict(r, op_name=r["op_name"][-120:]) for r in rows
                                if r["model_s"] >= DETAIL_MIN_S])
  return record


def markdown(payload: dict[str, Any]) -> str:
  """``hlo_cost.md``: the totals table, shares by kind and part, and the top kernels."""
  cells = payload["cells"]
  lines = [f"# Modelled kernel time of the train step ({payload['target_name']})\n",
           f"{payload['header']}\n", f"Command: `{payload['command']}`\n",
           "| spec | length | modelled ms | vs first | GB moved | TFLOP | kernels |",
           "|---|---|---|---|---|---|---|"]
  first: dict[int, float] = {}
  for c in cells:
    if c["status"] != "ok":
      lines.append(f"| `{c['spec']}` | {c['length']} | {c['status']}: {c['reason']} | | | | |")
      continue
    base = first.setdefault(c["length"], c["model_ms"])
    fell_back = f" (fell back: {'; '.join(c['fallbacks'])})" if c.get("fallbacks") else ""
    lines.append(f"| `{c['spec']}`{fell_back} | {c['length']} | {c['model_ms']:.2f} | "
                 f"{base / c['model_ms']:.2f}x | {c['bytes'] / 1e9:.1f} | "
                 f"{c['flops'] / 1e12:.3f} | {c['kernels']} |")
  for field, title in (("by_kind", "kind"), ("by_part", "model part (source op)")):
    ok = [c for c in cells if c["status"] == "ok"]
    keys = sorted({k for c in ok for k in c[field]}, key=lambda k: -ok[0][field].get(k, 0))
    lines += ["", f"Modelled ms by {title}:", "",
              "| spec | length | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    for c in ok:
      lines.append(f"| `{c['spec']}` | {c['length']} | "
                   + " | ".join(f"{c[field].get(k, 0):.2f}" for k in keys) + " |")
  for c in cells:
    if c["status"] != "ok":
      continue
    lines += ["", f"Largest kernels of `{c['spec']}` at {c['length']}:", "",
              "| modelled ms | MB | GFLOP | kind | part | kernel | shape | source op |",
              "|---|---|---|---|---|---|---|---|"]
    for r in c["top"]:
      lines.append(f"| {r['model_s'] * 1e3:.3f} | {r['bytes'] / 1e6:.0f} | "
                   f"{r['flops'] / 1e9:.1f} | {r['kind']} | {r['part']} | `{r['name']}` | "
                   f"`{r['shape'][:60]}` | {r['op_name'][-70:]} |")
  return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None,
         args: argparse.Namespace | None = None) -> dict[str, Any]:
  """Command line: models every (spec, length) cell and writes the two files. ``args``: the
  flags already parsed (:func:`parse_args`), as the script's own run passes them; else they are
  parsed from ``argv``.

  Raises:
    SystemExit: (after writing them) if no cell compiled; at once for ``--target h100``
      without the CUDA plugin.
  """
  args = parse_args(argv) if args is None else args
  for spec in args.specs:
    parse_spec(spec)   # a malformed spec fails before any compile
  bandwidth = args.bandwidth or HBM_EFFICIENCY * H100["memory_bandwidth"]
  mesh = target_mesh(args.target)
  device = mesh.devices.flat[0]
  target_name = (H100["name"] + ", compiled without a GPU" if args.target == "h100"
                 else f"{device.device_kind} ({device.platform})")
  cells = []
  for length in args.lengths:
    for spec in args.specs:
      cell = measure(spec, length, args.batch, args.dtype, mesh, args.target, bandwidth,
                     args.matmul_peak, args.top)
      print(f"{spec} L={length}: " + (f"{cell['model_ms']:.2f} ms modelled, "
            f"{cell['bytes'] / 1e9:.1f} GB, compiled in {cell['compile_s']} s"
            if cell["status"] == "ok" else f"{cell['status']}: {cell['reason']}"), flush=True)
      cells.append(cell)
  header = (f"{args.dtype}, batch {args.batch}, jax {jax.__version__}; bandwidth "
            f"{bandwidth / 1e12:.2f} TB/s, matmul peak {args.matmul_peak / 1e12:.0f} TFLOP/s. "
            "A kernel's modelled time is max(bytes / bandwidth, FLOPs / peak): a lower bound "
            "that ignores caches, launch gaps and non-matmul arithmetic.")
  payload = {"target": args.target, "target_name": target_name, "header": header,
             "command": shlex.join(["python", "benchmarks/hlo_cost.py",
                                    *(argv if argv is not None else sys.argv[1:])]),
             "cells": cells}
  text = markdown(payload)
  paths = sm.write_json_and_text(args.out, "hlo_cost", {**payload, "cells": []}, text)
  with open(paths["json"], "w") as f:   # every kernel of every cell: compact, not indented
    json.dump(payload, f, separators=(",", ":"))
  print(text)
  if not any(c["status"] == "ok" for c in cells):
    raise SystemExit(f"hlo_cost: no cell compiled; the reasons are in {paths['md']}")
  return payload


if __name__ == "__main__":
  main(args=_ARGS)
