"""Compiling the train and eval steps for a TPU slice on a machine without a TPU.

With ``libtpu`` (the ``tpu`` extra), JAX compiles for a described TPU topology on any host:
:func:`compile_report` lowers ``train.py``'s pmapped steps for a slice's compile-only devices
and reads XLA's memory and cost analyses, as MaxText's ``train_compile.py`` does. It shows that
the step compiles and what HBM one chip needs; not speed, input pipeline or host memory.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from simpletron_jax.data import batches, tasks
from simpletron_jax.model import encoders
from simpletron_jax.model.attention import base, softmax
from simpletron_jax.train import run_config, train_state
from simpletron_jax.train.steps import pmap_steps

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class SliceSpec:
  """A TPU slice as libtpu describes it: ``topology`` (``"<generation>:<chips per axis>"``),
  ``chip_config`` (``"megacore"``: v4, v5p, two TensorCores per JAX device; ``"default"``: one)
  and ``chips_per_host`` along each axis (the VM's shape)."""

  topology: str
  chip_config: str
  chips_per_host: tuple[int, int, int]


# ``--accelerator-type`` names -> libtpu's description; chips per host as in MaxText's
# ``accelerator_to_spec_map.py`` (v4, v5p: 2x2x1; v5e, v6e: 2x4 single-host, 2x2 multi-host).
SLICES = {
    "v4-8": SliceSpec("v4:2x2x1", "megacore", (2, 2, 1)),
    "v4-16": SliceSpec("v4:2x2x2", "megacore", (2, 2, 1)),
    "v5e-4": SliceSpec("v5e:2x2", "default", (2, 2, 1)),
    "v5e-8": SliceSpec("v5e:2x4", "default", (2, 4, 1)),
    "v5e-16": SliceSpec("v5e:4x4", "default", (2, 2, 1)),
    "v5p-8": SliceSpec("v5p:2x2x1", "megacore", (2, 2, 1)),
    "v6e-8": SliceSpec("v6e:2x4", "default", (2, 4, 1)),
    "v6e-16": SliceSpec("v6e:4x4", "default", (2, 2, 1)),
}

# HBM per JAX device (one chip; v4 and v5p: one megacore device) by ``device_kind``, in bytes.
# Compile-only devices have no memory_stats(), so the figures are Google Cloud's per-chip
# "HBM2 capacity" (cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e).
HBM_BYTES = {
    "TPU v4": 32 * GIB,
    "TPU v5 lite": 16 * GIB,
    "TPU v5": 95 * GIB,
    "TPU v5p": 95 * GIB,
    "TPU v6 lite": 32 * GIB,
}


class TpuCheckError(ValueError):
  """A slice name, config or step that cannot be checked; the message names it."""


def slice_devices(name: str) -> list:
  """The compile-only devices of a TPU slice, one per chip (platform ``"tpu"``), usable for
  ``jax.pmap(..., devices=...)`` lowering and compiling, not running.

  ``name``: a key of :data:`SLICES` (``"v5e-8"``) or a libtpu topology (``"v5e:2x4"``; one
  TensorCore per device, 4 chips per host above 8 chips).

  Raises:
    TpuCheckError: for an unknown name, or when ``libtpu`` is missing (naming the extra).
  """
  # libtpu locks /tmp/libtpu_lockfile for the process owning the chips; compiling needs no chip.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  spec = SLICES.get(name)
  if spec is None:
    if ":" not in name:
      raise TpuCheckError(f"unknown TPU slice {name!r}; known: {sorted(SLICES)}, or a libtpu "
                          "topology such as 'v5e:2x4'")
    spec = SliceSpec(name, "default", (2, 4, 1) if _chips(name) <= 8 else (2, 2, 1))
  try:
    desc = topologies.get_topology_desc(
        platform="tpu", topology_name=spec.topology, chip_config_name=spec.chip_config,
        chips_per_host_bounds=spec.chips_per_host, num_slices=1, wrap=(False, False, False))
  except (RuntimeError, ValueError) as e:   # jaxlib's errors, or no libtpu
    raise TpuCheckError(f"cannot describe TPU slice {name!r} ({spec.topology}): "
                        f"{str(e).splitlines()[0][:300]}. Is libtpu installed "
                        "(pip install -e '.[tpu]')?") from e
  return list(desc.devices)


def _chips(topology: str) -> int:
  """Chips in a libtpu topology name (``"v5e:4x4"`` -> 16)."""
  return math.prod(int(n) for n in topology.split(":", 1)[1].split("x"))


def hbm_bytes(device) -> int | None:
  """HBM of one device in bytes: from the device where JAX gives it, else :data:`HBM_BYTES`
  by ``device_kind``; None for a kind the table lacks."""
  try:
    stats = device.memory_stats() or {}
    if stats.get("bytes_limit"):
      return int(stats["bytes_limit"])
  except Exception:  # pylint: disable=broad-except  (compile-only devices raise)
    pass
  return HBM_BYTES.get(device.device_kind)


def task_sizes(config: ml_collections.ConfigDict) -> tuple[int, int, bool]:
  """``(vocab_size, num_classes, dual)`` of ``config.task`` from its record, without its data.

  Raises:
    TpuCheckError: an unknown task, or one whose vocabulary its data gives (``agnews``).
  """
  try:
    spec = tasks.get(config.task)
  except ValueError as e:
    raise TpuCheckError(str(e)) from None
  if spec.vocab_size is None:
    known = [t for t in tasks.names() if tasks.get(t).vocab_size is not None]
    raise TpuCheckError(f"task={config.task!r}: its vocabulary size comes from its data (the "
                        f"tokenizer), so it cannot be checked without loading them; tasks "
                        f"with a fixed vocabulary: {', '.join(known)}")
  return spec.vocab_size, spec.num_classes, spec.dual


def abstract_batch(n_devices: int, rows: int, width: int, dual: bool) -> dict[str, Any]:
  """The sharded batch ``shard(make_batch(...))`` gives, as shapes only: ``rows`` global rows
  over ``n_devices``, ``width`` padded tokens; ``dual`` adds the second document.

  Returns:
    ``{"inputs", "mask", "targets", "weights"[, "inputs2", "mask2"]}`` of
    ``jax.ShapeDtypeStruct`` ``[n_devices, rows / n_devices(, width)]``, dtypes int32, bool,
    int32, float32 as in :func:`simpletron_jax.data.common.make_batch`.
  """
  per = rows // n_devices
  batch = {"inputs": jax.ShapeDtypeStruct((n_devices, per, width), np.int32),
           "mask": jax.ShapeDtypeStruct((n_devices, per, width), np.bool_),
           "targets": jax.ShapeDtypeStruct((n_devices, per), np.int32),
           "weights": jax.ShapeDtypeStruct((n_devices, per), np.float32)}
  if dual:
    batch["inputs2"], batch["mask2"] = batch["inputs"], batch["mask"]
  return batch


def _stacked(tree, n: int):
  """Every leaf of ``tree`` as a ``[n, *shape]`` ShapeDtypeStruct (the replicated layout)."""
  return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct((n, *x.shape), x.dtype), tree)


def _memory(compiled) -> dict[str, int]:
  """Bytes per device from ``compiled.memory_analysis()``; ``peak`` = arguments + outputs -
  aliased (donated) + temporaries + generated code."""
  m = compiled.memory_analysis()
  out = {"argument_bytes": int(m.argument_size_in_bytes),
         "output_bytes": int(m.output_size_in_bytes),
         "alias_bytes": int(m.alias_size_in_bytes),
         "temp_bytes": int(m.temp_size_in_bytes),
         "generated_code_bytes": int(m.generated_code_size_in_bytes)}
  out["peak_bytes"] = (out["argument_bytes"] + out["output_bytes"] - out["alias_bytes"]
                       + out["temp_bytes"] + out["generated_code_bytes"])
  return out


def _cost(compiled) -> dict[str, float]:
  """XLA's FLOPs and bytes accessed per device and step (``compiled.cost_analysis()``)."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):   # older jax: one dict per computation
    cost = cost[0] if cost else {}
  return {"flops": float(cost.get("flops", float("nan"))),
          "bytes_accessed": float(cost.get("bytes accessed", float("nan")))}


def _first_line(error: BaseException) -> str:
  text = str(error).strip().splitlines()
  return f"{type(error).__name__}: {text[0][:400] if text else ''}"


def step_widths(config: ml_collections.ConfigDict, data: tasks.TaskData,
                n_devices: int) -> dict[str, list[int]]:
  """Every padded width in tokens the run meets, ``{"train": [...], "eval": [...]}``: the
  micro-batches of the first epoch or of ``num_train_steps`` (the fewer), and the batches of
  a validation and of the test (``num_eval_steps``, ``num_test_steps``)."""
  batch = batches.BatchConfig.from_config_dict(config)
  micro = batch.micro_batch_size
  count = min(len(data.train) // micro, config.num_train_steps * batch.grad_accum_steps)
  ds = batches.train_index_batches(data.train, batch)
  train = {batches.batch_width(data.train, np.asarray(ds[i]), batch) for i in range(count)}
  rows = batch.eval_rows(n_devices)
  evals = set()
  for split, limit in ((data.val, config.num_eval_steps), (data.test, config.num_test_steps)):
    for idx, _ in batches.eval_index_batches(split, batch, rows, limit):
      evals.add(batches.batch_width(split, idx, batch))
  return {"train": sorted(train), "eval": sorted(evals)}


def compile_report(config: ml_collections.ConfigDict, slice_name: str,
                   steps: Iterable[str] = ("train", "eval"),
                   widths: dict[str, list[int]] | None = None,
                   on_compiled: Callable[[dict[str, Any]], None] | None = None
                   ) -> dict[str, Any]:
  """Compiles ``train.py``'s pmapped steps of ``config`` for a TPU slice; memory and cost.

  The model is built as ``train.py`` builds it, under
  :func:`simpletron_jax.model.attention.base.compiling_for` ``("tpu")`` so that
  ``implementation="flash"`` picks the Pallas TPU kernel; state and batches are shapes only.

  Args:
    config: the run config.
    slice_name: see :func:`slice_devices`.
    steps: ``"train"`` (state donated) and/or ``"eval"``.
    widths: ``{"train": [...], "eval": [...]}`` padded widths in tokens; default
      ``model.max_length``, the widest.
    on_compiled: called with each compile's record as it finishes.

  Returns:
    ``{"slice", "topology", "device_kind", "devices", "processes", "hbm_bytes", "dtype",
    "task", "attention", "implementation", "compiles", "peak_bytes", "ok"}``; a record has
    ``step``, ``width``, ``rows_per_device``, ``compile_seconds``, the bytes of :func:`_memory`,
    ``flops`` and ``bytes_accessed`` per device, ``fits`` (peak <= HBM), ``fallbacks`` (attention
    implementations replaced while tracing), or ``error`` (the compiler's first line). ``ok``:
    every step compiled and fits.

  Raises:
    TpuCheckError: an unknown slice, task or step, or rows the slice's devices do not divide.
    ValueError: from :meth:`run_config.RunConfig.from_config_dict`, naming the field.
  """
  devices = slice_devices(slice_name)
  n = len(devices)
  run = run_config.RunConfig.from_config_dict(config, n, len({d.process_index for d in devices}))
  vocab_size, num_classes, dual = task_sizes(config)
  model = encoders.build_classifier(config.model, vocab_size=vocab_size,
                                    num_classes=num_classes, dual=dual)
  state = jax.eval_shape(lambda: train_state.create_train_state(
      run.train, model, jax.random.PRNGKey(0), run.model.max_length))
  p_train, p_eval = pmap_steps(state.apply_fn, devices=devices)
  widths = widths or {s: [int(config.model.max_length)] for s in ("train", "eval")}
  hbm = hbm_bytes(devices[0])
  report = {"slice": slice_name, "topology": SLICES[slice_name].topology
            if slice_name in SLICES else slice_name, "device_kind": devices[0].device_kind,
            "devices": n, "processes": len({d.process_index for d in devices}),
            "hbm_bytes": hbm, "dtype": str(config.model.dtype), "task": config.task,
            "attention": config.model.attention,
            "implementation": str(config.model.attention_kwargs.get("implementation", "")),
            "compiles": []}
  state_n = _stacked(state, n)
  rng = jax.ShapeDtypeStruct((2,), jnp.uint32)
  micro = run.batches.micro_batch_size
  for step in steps:
    if step not in ("train", "eval"):
      raise TpuCheckError(f"unknown step {step!r}; expected 'train' or 'eval'")
    rows = micro if step == "train" else run.batches.eval_rows(n)
    for width in widths.get(step, []):
      batch = abstract_batch(n, rows, width, dual)
      record = {"step": step, "width": width, "rows_per_device": rows // n}
      start = time.time()
      try:
        with base.compiling_for("tpu"), softmax.recording_fallbacks() as fallbacks:
          lowered = (p_train.lower(state_n, batch, rng) if step == "train"
                     else p_eval.lower(state_n.params, batch))
        record["fallbacks"] = sorted(set(fallbacks))
        compiled = lowered.compile()
        record.update(_memory(compiled), **_cost(compiled))
        record["fits"] = hbm is None or record["peak_bytes"] <= hbm
      except Exception as e:  # pylint: disable=broad-except  (the compiler's verdict)
        record.update(error=_first_line(e), fits=False)
      record["compile_seconds"] = round(time.time() - start, 1)
      report["compiles"].append(record)
      if on_compiled is not None:
        on_compiled(record)
  peaks = [r["peak_bytes"] for r in report["compiles"] if "peak_bytes" in r]
  report["peak_bytes"] = max(peaks) if peaks else None
  report["ok"] = bool(report["compiles"]) and all(r["fits"] for r in report["compiles"])
  return report


def summary_line(report: dict[str, Any]) -> str:
  """One line for a report: the verdict, the peak GiB per chip against the HBM."""
  hbm = report["hbm_bytes"]
  peak = report["peak_bytes"]
  where = f"{report['task']}/{report['attention']} {report['dtype']} on {report['slice']}"
  if report["ok"] and hbm is None:   # a device kind HBM_BYTES lacks: no verdict on memory
    return (f"OK: {where} compiles: peak {peak / GIB:.2f} GiB per chip; the HBM of a "
            f"{report['device_kind']!r} chip is unknown (add it to tpu_aot.HBM_BYTES)")
  if report["ok"]:
    return (f"OK: {where} compiles and fits: peak {peak / GIB:.2f} GiB of "
            f"{hbm / GIB:.0f} GiB HBM per chip")
  errors = [r for r in report["compiles"] if "error" in r]
  if errors:
    r = errors[0]
    return f"FAIL: {where}: the {r['step']} step at width {r['width']} does not compile: {r['error']}"
  return (f"FAIL: {where} needs {peak / GIB:.2f} GiB per chip, more than the "
          f"{hbm / GIB:.0f} GiB HBM")
