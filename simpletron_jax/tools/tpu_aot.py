"""Compiling the train and eval steps for a TPU slice on a machine without a TPU.

``libtpu`` (the ``tpu`` extra of this project) lets JAX describe a TPU topology and compile for
it on any host: :func:`slice_devices` gives the compile-only devices of a named slice, and
:func:`compile_report` lowers the same pmapped steps that ``train.py`` runs
(:func:`simpletron_jax.train.steps.pmap_steps`, the same model, dtype and options) for those
devices and reads XLA's memory and cost analyses of the TPU executables. MaxText checks its
training step the same way before a slice is booked (its ``train_compile.py``); the slice
shapes below (topology, megacore, chips per host) follow its table of accelerators.

What it proves: the step compiles for that TPU generation and slice, and how many bytes one chip
needs for arguments, outputs, temporaries and code, which is compared with the chip's HBM.
What it cannot prove: speed (no clock), and input-pipeline or host memory.
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
  """A TPU slice as ``libtpu`` describes it.

  Attributes:
    topology: libtpu's topology name, ``"<generation>:<chips per axis>"``.
    chip_config: ``"megacore"`` (v4, v5p: a chip's two TensorCores are one JAX device) or
      ``"default"`` (one TensorCore per chip).
    chips_per_host: chips of one host along each axis (the VM's shape).
  """

  topology: str
  chip_config: str
  chips_per_host: tuple[int, int, int]


# User-facing slice names (as ``gcloud compute tpus tpu-vm create --accelerator-type`` takes
# them) -> how libtpu describes them. Chips per host: v4 and v5p hosts have 4 chips (2x2x1),
# v5e and v6e single-host slices up to 8 (2x4), and 4 per host (2x2) in multi-host slices, as
# in MaxText's ``accelerator_to_spec_map.py``.
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

# HBM per JAX device (one chip; v4 and v5p chips are one megacore device), in bytes, by
# ``device.device_kind``. JAX gives no HBM size for a compile-only device (``memory_stats()``
# needs an addressable one), so the figures come from Google Cloud's TPU pages
# (cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e: "HBM2 capacity" per chip).
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
  """The compile-only devices of a TPU slice.

  Args:
    name: a key of :data:`SLICES` (``"v5e-8"``) or a libtpu topology name
      (``"v5e:2x4"``, described with one TensorCore per device and 4 chips per host where the
      slice has more than 8).

  Returns:
    The slice's ``jax.Device`` list (one per chip; platform ``"tpu"``), usable as
    ``jax.pmap(..., devices=...)`` for lowering and compiling, not for running.

  Raises:
    TpuCheckError: for an unknown name, or when ``libtpu`` is missing (naming the extra).
  """
  # libtpu takes a lock file per host (/tmp/libtpu_lockfile) for the process that owns the
  # chips; compiling needs no chips, so let several checks (and pytest workers) load it.
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
  """``(vocab_size, num_classes, dual)`` of ``config.task`` from its record
  (:func:`simpletron_jax.data.tasks.get`), without loading its data.

  Raises:
    TpuCheckError: for an unknown task (naming the config field ``task`` and the known
      ones), or a task whose vocabulary only its data gives (``agnews``: the tokenizer's).
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
  """The sharded batch ``shard(make_batch(...))`` gives, as shapes only.

  Args:
    n_devices: devices of the pmap.
    rows: global rows, a multiple of ``n_devices``.
    width: padded tokens per row (the widest is ``model.max_length``).
    dual: add the second document (retrieval).

  Returns:
    ``{"inputs", "mask", "targets", "weights"[, "inputs2", "mask2"]}`` as
    ``jax.ShapeDtypeStruct`` of shape ``[n_devices, rows / n_devices(, width)]`` with the
    dtypes of :func:`simpletron_jax.data.common.make_batch` (int32, bool, int32, float32).
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
  """Every padded width the run meets: ``{"train": [...], "eval": [...]}`` in tokens.

  Train: the micro-batches of the run's first epoch or of ``num_train_steps`` (whichever is
  fewer), in :func:`batches.train_index_batches` order; eval: the batches of a validation and
  of the test, as :func:`evaluation.evaluate` reads them (``num_eval_steps``,
  ``num_test_steps``).
  """
  micro = batches.micro_batch_size(config)
  count = min(len(data.train) // micro, config.num_train_steps * config.grad_accum_steps)
  ds = batches.train_index_batches(data.train, config)
  train = {batches.batch_width(data.train, np.asarray(ds[i]), config) for i in range(count)}
  rows = eval_rows(config, n_devices)
  evals = set()
  for split, limit in ((data.val, config.num_eval_steps), (data.test, config.num_test_steps)):
    for idx, _ in batches.eval_index_batches(split, config, rows, limit):
      evals.add(batches.batch_width(split, idx, config))
  return {"train": sorted(train), "eval": sorted(evals)}


def eval_rows(config: ml_collections.ConfigDict, n_devices: int) -> int:
  """Global rows of an eval batch on ``n_devices`` (:func:`batches.eval_batch_size`'s rule)."""
  rows = config.eval_batch_size or batches.micro_batch_size(config)
  return -(-rows // n_devices) * n_devices


def compile_report(config: ml_collections.ConfigDict, slice_name: str,
                   steps: Iterable[str] = ("train", "eval"),
                   widths: dict[str, list[int]] | None = None,
                   on_compiled: Callable[[dict[str, Any]], None] | None = None
                   ) -> dict[str, Any]:
  """Compiles ``train.py``'s pmapped steps of ``config`` for a TPU slice; memory and cost.

  The model is built as ``train.py`` builds it, with the attention modules told that the
  target is a TPU (:func:`simpletron_jax.model.attention.base.compiling_for`), so
  ``implementation="flash"`` picks the Pallas TPU kernel. The state and batches are shapes
  only: nothing is initialised or run.

  Args:
    config: the run config (a ``configs/`` file with overrides).
    slice_name: see :func:`slice_devices`.
    steps: ``"train"`` (the train step, state donated) and/or ``"eval"`` (eval.py's step).
    widths: ``{"train": [...], "eval": [...]}`` padded widths in tokens to compile; default
      the widest, ``model.max_length``, which bounds the memory.
    on_compiled: called with each compile's record as it finishes (progress).

  Returns:
    ``{"slice", "topology", "device_kind", "devices", "processes", "hbm_bytes", "dtype",
    "task", "attention", "compiles": [record, ...], "fits", "peak_bytes", "ok"}``. A record has
    ``step``, ``width``, ``rows_per_device``, ``compile_seconds``, the bytes of
    :func:`_memory`, ``flops`` and ``bytes_accessed`` per device, ``fits`` (peak <= HBM),
    ``fallbacks`` (the reasons a requested attention implementation was replaced while the
    step was traced, e.g. ``flash`` -> ``einsum`` under attention dropout), or ``error`` (the
    compiler's first line, e.g. its HBM OOM) when it did not compile.
    ``ok``: every step compiled and fits.

  Raises:
    TpuCheckError: for an unknown slice or task, or a batch that does not split over the
      slice's devices (naming ``batch_size``).
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
  micro = batches.micro_batch_size(config)
  for step in steps:
    if step not in ("train", "eval"):
      raise TpuCheckError(f"unknown step {step!r}; expected 'train' or 'eval'")
    rows = micro if step == "train" else eval_rows(config, n)
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
