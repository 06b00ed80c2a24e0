"""Profiles the benchmark's train step with the JAX profiler and summarises the top kernels.

    python benchmarks/profile_step.py --variant simple --length 4096 --dtype bfloat16 \
        --out /tmp/profile_simple_4k

The step is the one of ``benchmarks/speed_memory.py`` (LRA text model, batch 32, full pmapped
train step on a resident random batch). After compiling and two warm-up steps, ``--steps``
steps run under ``jax.profiler.trace(create_perfetto_trace=True)``. The Perfetto JSON trace
is read back and every complete event ("ph": "X") on the kernel tracks (GPU streams, a TPU's
``XLA Ops`` line, on CPU the XLA thunks) is summed by name. The lines XProf derives from the
kernels (``XLA Modules``, ``XLA Ops`` beside streams, ...) are not counted again; the
``XLA Modules`` line gives the program time per step, gaps included. Writes
``profile_summary.txt`` (the top ``--top`` kernels with their share of kernel time, each with
the JAX op it comes from, read from the compiled step's HLO metadata, and shares by kind:
matmul, attention, fusions, copies, random bits) and ``profile_summary.json`` to ``--out``;
the raw trace stays in ``--out/trace``.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from simpletron_jax.runtime import cli  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  """The command line (see the module docstring)."""
  parser = cli.ArgumentParser(prog="profile_step.py",
                              description=__doc__.split("\n", maxsplit=1)[0])
  parser.add_argument("--variant", default="simple", help="a speed_memory.py row label")
  parser.add_argument("--length", type=int, default=4096)
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--top", type=int, default=25)
  parser.add_argument("--set", nargs="+", default=(), metavar="FIELD=VALUE",
                      help="model.* overrides, as in speed_memory.py")
  parser.add_argument("--out", required=True)
  return parser.parse_args(argv)


if __name__ == "__main__":
  # The flags first: --help and a bad invocation end here, before the imports below load JAX.
  _ARGS = parse_args()

import jax  # noqa: E402

import speed_memory as sm  # noqa: E402
from simpletron_jax.model import encoders  # noqa: E402
from simpletron_jax.train import run_config, train_state  # noqa: E402
from simpletron_jax.train.steps import pmap_steps, replicate  # noqa: E402


# Kernel kinds, first match wins (names of cuBLAS/cuDNN/XLA GPU kernels and XLA CPU ops;
# XLA CPU runs many dots as XNNPACK/YNNPACK fusions, ``ynn_fusion.N``).
KINDS = (
    ("attention (cuDNN)", r"cudnn|flash|fmha|sdpa"),
    ("matmul", r"gemm|cublas|cutlass|matmul|dot|sm90_xmma|nvjet|[xy]nn_fusion"),
    ("random bits", r"threefry|rng|random"),
    ("copy / transpose", r"copy|transpose|memcpy|memset"),
    ("reduction", r"reduce"),
    ("fusion (elementwise)", r"fusion|loop|input_"),
)


# JAX ops whose kernels draw random bits, in a kernel's source op path: XLA fuses threefry's
# rounds into plain ``broadcast_add_fusion``s (CPU) or ``loop_*`` fusions (GPU).
RANDOM_SOURCE = re.compile(r"threefry|random_bits|jit\((?:_uniform|_bernoulli)\)")


def kind_of(name: str, source: str = "") -> str:
  """The kernel kind of a trace event name (see :data:`KINDS`); ``"other"`` if none.
  ``source``, the JAX op path the kernel comes from (:func:`hlo_sources`), marks the fused
  rounds of the random-bit generator as ``random bits`` (:data:`RANDOM_SOURCE`) unless the
  name says matmul."""
  lower = name.lower()
  kind = next((kind for kind, pattern in KINDS if re.search(pattern, lower)), "other")
  return "random bits" if kind != "matmul" and RANDOM_SOURCE.search(source) else kind


def load_trace(trace_dir: str) -> dict[str, Any]:
  """The newest ``perfetto_trace.json.gz`` under ``trace_dir``.

  Raises:
    FileNotFoundError: if the profiler wrote none.
  """
  paths = sorted(glob.glob(os.path.join(trace_dir, "**", "*.json.gz"), recursive=True),
                 key=os.path.getmtime)
  if not paths:
    raise FileNotFoundError(f"no Perfetto trace (*.json.gz) under {trace_dir}")
  with gzip.open(paths[-1], "rt") as f:
    return json.load(f)


# Lines of a device plane that XProf derives from the kernels (a module span per program
# run, one span per HLO op, ...): summing them with the kernels would count time twice or more.
DERIVED_LINES = frozenset({"XLA Modules", "XLA Ops", "Async XLA Ops", "Framework Ops",
                           "Framework Name Scope", "TensorFlow Ops", "TensorFlow Name Scope",
                           "Launch Stats", "Source code", "Steps", "Sparse Core Steps",
                           "Sparse Core Modules"})


def _thread_names(events: list[dict[str, Any]]) -> dict[tuple[Any, Any], str]:
  return {(e["pid"], e.get("tid")): e.get("args", {}).get("name", "") for e in events
          if e.get("ph") == "M" and e.get("name") == "thread_name"}


def device_events(trace: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
  """The kernel events of a Perfetto JSON trace, each counted once.

  On a GPU or TPU (processes named like ``/device:GPU:0``) these are the complete events
  ("ph": "X") on the kernel tracks: threads named ``Stream ...`` where there are any (GPU),
  else the ``XLA Ops`` line (TPU). The lines XProf derives from the kernels (``XLA Modules``,
  ``XLA Ops`` beside streams, ``Launch Stats``, ...; see :data:`DERIVED_LINES`) are left out.
  On CPU they are the XLA thunks: every complete event off the ``python`` thread that is not
  a host-runtime frame, nor the thunk executor's ``end: ...`` marker that repeats each thunk.

  Returns:
    ``(events, tracks)``: the events, and the names of the tracks they came from (for the
    summary, so a reader sees what was counted).
  Raises:
    ValueError: if no kernel event is found; the message lists the tracks seen.
  """
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  procs = {e["pid"]: e.get("args", {}).get("name", "") for e in events
           if e.get("ph") == "M" and e.get("name") == "process_name"}
  threads = _thread_names(events)
  device_pids = {pid for pid, name in procs.items() if re.search(r"/device:(GPU|TPU)", name)}
  complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
  if device_pids:
    lines = {key: name for key, name in threads.items() if key[0] in device_pids}
    streams = {key for key, name in lines.items() if name.startswith("Stream")}
    keep = streams or {key for key, name in lines.items() if name == "XLA Ops"}
    if not keep:  # unnamed device tracks: everything but the derived lines
      keep = {(e["pid"], e.get("tid")) for e in complete if e["pid"] in device_pids
              and lines.get((e["pid"], e.get("tid")), "") not in DERIVED_LINES}
    chosen = [e for e in complete if (e["pid"], e.get("tid")) in keep]
  else:
    host_frames = re.compile(r"\$|\.py|PjitFunction|pmap|ThunkExecutor|Execute|TfrtCpu|::|"
                             r"^end: |^Wait for |^Handle |ParseArguments|DevicePut")
    chosen = [e for e in complete if threads.get((e["pid"], e.get("tid"))) != "python"
              and not host_frames.search(e.get("name", ""))]
  def track(e):
    key = (e["pid"], e.get("tid"))
    return f"{procs.get(key[0], key[0])} / {threads.get(key, key[1])}"
  tracks = sorted({track(e) for e in chosen})
  if not chosen:
    seen = sorted({f"{procs.get(pid, pid)} / {name}" for (pid, _), name in threads.items()})
    raise ValueError(f"no kernel events in the trace; tracks seen: {seen}")
  return chosen, tracks


def module_us_per_step(trace: dict[str, Any], steps: int) -> float | None:
  """Device time per step from the ``XLA Modules`` line (program start to end, gaps between
  kernels included), in microseconds; None where the trace has no such line (CPU)."""
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  modules = {key for key, name in _thread_names(events).items() if name == "XLA Modules"}
  per_line: dict[tuple[Any, Any], float] = collections.Counter()
  for e in events:  # one module line per device; the busiest device's total
    if e.get("ph") == "X" and "dur" in e and (e["pid"], e.get("tid")) in modules:
      per_line[(e["pid"], e.get("tid"))] += float(e["dur"])
  if not per_line:
    return None
  return max(per_line.values()) / steps


def summarize(events: list[dict[str, Any]], steps: int, top: int,
              sources: dict[str, str] | None = None) -> dict[str, Any]:
  """Per-name and per-kind totals of ``events`` (durations in microseconds).

  Args:
    events: kernel events (:func:`device_events`).
    steps: traced steps, to divide by.
    top: kernels to list.
    sources: ``{kernel name: JAX op path}`` (:func:`hlo_sources`); used for each kernel's
      kind (:func:`kind_of`) and listed as its ``source`` ("" if unknown).

  Returns:
    ``{"device_us_per_step", "kernels": [{name, kind, us_per_step, share, calls_per_step,
    source}], "kinds": {kind: share}}``, kernels sorted by time, the first ``top`` of them.
  """
  sources = sources or {}
  by_name: dict[str, list[float]] = collections.defaultdict(list)
  for e in events:
    by_name[e["name"]].append(float(e["dur"]))
  total = sum(sum(d) for d in by_name.values()) or 1.0
  kinds: dict[str, float] = collections.Counter()
  for name, durs in by_name.items():
    kinds[kind_of(name, sources.get(name, ""))] += sum(durs) / total
  ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))
  return {
      "device_us_per_step": total / steps,
      "kernels": [{"name": name, "kind": kind_of(name, sources.get(name, "")),
                   "us_per_step": sum(d) / steps, "share": sum(d) / total,
                   "calls_per_step": len(d) / steps, "source": sources.get(name, "")}
                  for name, d in ranked[:top]],
      "kinds": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
  }


_NAMED = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*\bop_name=\"([^\"]*)\"")


def hlo_sources(hlo_text: str) -> dict[str, str]:
  """``{kernel name: JAX op path}`` from an optimized HLO module's metadata.

  A GPU kernel is named after its HLO instruction with ``.`` turned into ``_``
  (``loop_pad_fusion.8`` runs as ``loop_pad_fusion_8``); library kernels (cuBLAS ``nvjet_*``,
  cuDNN) have no instruction of their name and get no entry.

  Returns:
    Both spellings of each instruction name with ``metadata={op_name=...}``, mapped to that
    op_name (e.g. ``pmap(train_step)/.../encoderblock_0/SimpleAttention_0/mul``).
  """
  out = {}
  for line in hlo_text.splitlines():
    found = _NAMED.match(line)
    if found:
      name, op_name = found.groups()
      out[name] = out[name.replace(".", "_")] = op_name
  return out


def _short_source(op_name: str, limit: int = 80) -> str:
  """``op_name`` from the encoder block on (or its last ``limit`` characters), marked
  ``backward`` when it comes from the gradient (``transpose(jvp(...))``)."""
  cut = re.search(r"encoderblock_\d+/.*$", op_name)
  text = cut.group(0) if cut else op_name
  text = text if len(text) <= limit else "..." + text[-limit:]
  return ("backward " if "transpose(jvp" in op_name else "") + text


def summary_text(summary: dict[str, Any], header: str) -> str:
  """The ``profile_summary.txt`` table."""
  lines = [header, "", f"kernel time per step: {summary['device_us_per_step'] / 1e3:.2f} ms "
           "(summed over the kernels, all devices)"]
  if summary.get("module_us_per_step"):
    lines.append(f"program time per step: {summary['module_us_per_step'] / 1e3:.2f} ms "
                 "(XLA Modules line: kernels plus the gaps between them)")
  lines += [f"tracks counted: {', '.join(summary.get('tracks', []))}", "", "share by kind:"]
  lines += [f"  {kind:<24} {100 * share:5.1f}%" for kind, share in summary["kinds"].items()]
  lines += ["", f"{'share':>6} {'ms/step':>8} {'calls':>6}  kind / kernel"]
  for k in summary["kernels"]:
    lines.append(f"{100 * k['share']:5.1f}% {k['us_per_step'] / 1e3:8.3f} "
                 f"{k['calls_per_step']:6.1f}  {k['kind']}: {k['name'][:110]}")
    if k.get("source"):
      lines.append(f"{'':23}from {_short_source(k['source'])}")
  return "\n".join(lines) + "\n"


def profile(variant: str, length: int, dtype: str, batch: int, steps: int, out: str,
            model_overrides: dict[str, Any] | None = None) -> tuple[str, str]:
  """Compiles, warms up and traces ``steps`` train steps.

  Returns:
    ``(trace folder, the compiled step's optimized HLO text)``.
  """
  setup = sm.variant_setup(variant, length)
  config = sm.lra_text_config(length, setup.attention, setup.attention_kwargs, batch, dtype,
                              {**setup.model_overrides, **(model_overrides or {})})
  model = encoders.build_classifier(config.model, vocab_size=sm.BYTE_VOCAB,
                                    num_classes=sm.NUM_CLASSES)
  state = replicate(
      train_state.create_train_state(
          run_config.TrainConfig.from_config_dict(config), model, jax.random.PRNGKey(0),
          config.model.max_length))
  p_train, _ = pmap_steps(model.apply)
  data = sm._device_batch(batch, length, jax.local_device_count())
  keys = jax.random.split(jax.random.PRNGKey(1), steps + 2)
  step = p_train.lower(state, data, keys[0]).compile()   # its HLO names the kernels
  for i in range(2):
    state, sums = step(state, data, keys[i])
  jax.block_until_ready((state, sums))
  trace_dir = os.path.join(out, "trace")
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    for i in range(steps):
      state, sums = step(state, data, keys[2 + i])
    jax.block_until_ready((state, sums))
  return trace_dir, step.as_text()


def main(argv: list[str] | None = None,
         args: argparse.Namespace | None = None) -> dict[str, Any]:
  """Profiles one (variant, length, dtype) and writes the summary files. ``args``: the flags
  already parsed (:func:`parse_args`), as the script's own run passes them; else they are parsed
  from ``argv``."""
  args = parse_args(argv) if args is None else args
  trace_dir, hlo_text = profile(args.variant, args.length, args.dtype, args.batch, args.steps,
                                args.out, sm.parse_overrides(args.set))
  trace = load_trace(trace_dir)
  events, tracks = device_events(trace)
  summary = summarize(events, args.steps, args.top, hlo_sources(hlo_text))
  summary["tracks"] = tracks
  summary["module_us_per_step"] = module_us_per_step(trace, args.steps)
  device = jax.local_devices()[0]
  header = (f"{args.variant}, L={args.length}, {args.dtype}, batch {args.batch}, "
            f"{args.steps} traced steps on {device.device_kind} ({device.platform}), "
            f"jax {jax.__version__}" + (f", set {' '.join(args.set)}" if args.set else ""))
  summary["header"] = header
  text = summary_text(summary, header)
  sm.write_json_and_text(args.out, "profile_summary", summary, text, text_ext="txt")
  print(text)
  return summary


if __name__ == "__main__":
  main(args=_ARGS)
