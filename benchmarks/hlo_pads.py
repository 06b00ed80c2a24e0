"""Counts the pads XLA put in front of matmuls in the benchmark's compiled train step.

    python benchmarks/hlo_pads.py --variant simple --lengths 4095 4096 --dtype bfloat16 \
        --out /tmp/hlo_pads
    python benchmarks/hlo_pads.py --variant simple --lengths 4096 --set length_multiple=8 ...

On Ampere and newer GPUs, XLA's ``CublasPadForGemms`` pass pads both matrix dimensions of a
bfloat16 cuBLAS matmul to a multiple of 8 (openxla/xla,
``xla/service/gpu/transforms/cublas_pad_for_gemms.cc``). The model's length with CLS is
``length + 1``, odd for LRA's lengths, so this would pad the attention's matmuls over the
length in every step; the profile of ``simple`` at 4K on an H100 shows two padding kernels
taking 6.8% of the step (issue 10). This script checks the cause without timing anything: it
compiles the step of ``benchmarks/speed_memory.py`` (through the persistent cache) and reads
the optimized HLO (``compiled.as_text()``):

* ``pads``: ``pad`` instructions anywhere, with their shapes and padding configs;
* ``padded_matmul_operands``: operands of matmul custom calls (cuBLAS, cuBLASLt) that are a
  pad, or a fusion whose computation holds a pad.

Writes ``hlo_pads.json`` and ``hlo_pads.md`` to ``--out``. On a CPU there is no such pass, so
the matmul column is 0 there.
"""

from __future__ import annotations

import argparse
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
  parser = cli.ArgumentParser(prog="hlo_pads.py", description=__doc__.split("\n", maxsplit=1)[0])
  parser.add_argument("--variant", default="simple", help="a speed_memory.py row label")
  parser.add_argument("--lengths", nargs="+", type=int, default=[4095, 4096])
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--set", nargs="+", default=(), metavar="FIELD=VALUE",
                      help="model.* overrides, as in speed_memory.py")
  parser.add_argument("--cache_dir", default="", help="persistent compilation cache")
  parser.add_argument("--out", required=True)
  return parser.parse_args(argv)


if __name__ == "__main__":
  # The flags first: --help and a bad invocation end here, before the imports below load JAX.
  _ARGS = parse_args()

import jax  # noqa: E402

import hlo_cost  # noqa: E402
import speed_memory as sm  # noqa: E402


_PADDING = re.compile(r"padding=([\w\-]+)")
_CALLS = re.compile(r"calls=%?([\w.\-]+)")
_MATMUL_TARGET = re.compile(r'custom_call_target="([^"]*(?:gemm|matmul|cublas)[^"]*)"', re.I)


def count_pads(hlo_text: str) -> dict[str, Any]:
  """The pads of an optimized HLO module's text and the matmul operands they feed.

  Args:
    hlo_text: ``compiled.as_text()`` of an XLA executable.

  Returns:
    ``{"pads": [{"computation", "name", "shape", "padding"}], "padded_matmul_operands":
    [{"matmul", "target", "operand"}], "matmuls": int}``: every ``pad``, the operands of
    matmul custom calls that are a pad or a fusion whose computation holds one, and the
    number of matmul custom calls.

  Raises:
    ValueError: from :func:`hlo_cost.parse_module` (no ENTRY computation).
  """
  computations, _ = hlo_cost.parse_module(hlo_text)
  pads = [{"computation": computation, "name": inst["name"], "shape": inst["shape"],
           "padding": _PADDING.search(inst["attrs"]).group(1)}
          for computation, body in computations.items() for inst in body
          if inst["op"] == "pad"]
  padding_computations = {pad["computation"] for pad in pads}
  instructions = {inst["name"]: inst for body in computations.values() for inst in body}
  padded_operands, matmuls = [], 0
  for inst in instructions.values():
    target = _MATMUL_TARGET.search(inst["attrs"])
    if inst["op"] != "custom-call" or not target:
      continue
    matmuls += 1
    for operand in inst["operands"]:
      source = instructions.get(operand)
      called = _CALLS.search(source["attrs"]) if source else None
      if source and (source["op"] == "pad"
                     or (called and called.group(1) in padding_computations)):
        padded_operands.append({"matmul": inst["name"], "target": target.group(1),
                                "operand": operand})
  return {"pads": pads, "padded_matmul_operands": padded_operands, "matmuls": matmuls}


def measure(label: str, length: int, dtype: str, batch: int,
            overrides: dict[str, Any] | None) -> dict[str, Any]:
  """Compiles one benchmark cell (:func:`speed_memory.prepare_cell`) and counts its pads.

  Returns:
    ``{"label", "length", "positions", "status", "reason"}`` plus :func:`count_pads`' fields
    (counts and lists) when it compiled. ``positions`` is ``length + 1`` (CLS).

  Raises:
    Nothing for a failing config: the record's ``status`` and ``reason`` say it.
  """
  record, cell = sm.prepare_cell(label, length, batch, dtype, None, overrides)
  out = {"label": label, "length": length, "positions": length + 1,
         "status": record["status"] if cell is None else "ok", "reason": record["reason"]}
  if cell is not None:
    found = count_pads(cell.step.as_text())
    out.update(found, n_pads=len(found["pads"]),
               n_padded_matmul_operands=len(found["padded_matmul_operands"]))
  return out


def markdown(rows: list[dict[str, Any]], header: str) -> str:
  """The ``hlo_pads.md`` table: a row per (variant, length)."""
  lines = [f"# Pads in the compiled train step\n\n{header}\n",
           "| variant | length (+ CLS) | pads | matmul operands padded | matmuls | paddings |",
           "|---|---|---|---|---|---|"]
  for r in rows:
    if r["status"] != "ok":
      lines.append(f"| `{r['label']}` | {r['positions']} | {r['status']}: {r['reason']} "
                   "| | | |")
      continue
    paddings = sorted({f"{p['shape']} {p['padding']}" for p in r["pads"]})
    lines.append(f"| `{r['label']}` | {r['positions']} | {r['n_pads']} | "
                 f"{r['n_padded_matmul_operands']} | {r['matmuls']} | "
                 f"{'<br>'.join(paddings[:6])}{' ...' if len(paddings) > 6 else ''} |")
  return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None,
         args: argparse.Namespace | None = None) -> list[dict[str, Any]]:
  """Command line: counts the pads for each length and writes the two files. ``args``: the
  flags already parsed (:func:`parse_args`), as the script's own run passes them; else they are
  parsed from ``argv``.

  Raises:
    SystemExit: (after writing them) if no length compiled.
  """
  args = parse_args(argv) if args is None else args
  if args.cache_dir:
    sm.enable_compilation_cache(args.cache_dir)
  overrides = sm.parse_overrides(args.set) or None
  rows = [measure(args.variant, length, args.dtype, args.batch, overrides)
          for length in args.lengths]
  device = jax.local_devices()[0]
  header = (f"{args.dtype}, batch {args.batch}, on {device.device_kind} ({device.platform}), "
            f"jax {jax.__version__}" + (f", set {' '.join(args.set)}" if args.set else "")
            + f". Command: `python benchmarks/hlo_pads.py {' '.join(argv or sys.argv[1:])}`")
  text = markdown(rows, header)
  paths = sm.write_json_and_text(args.out, "hlo_pads", {"header": header, "rows": rows}, text)
  print(text)
  if not any(r["status"] == "ok" for r in rows):
    raise SystemExit(f"hlo_pads: no cell compiled; the reasons are in {paths['md']}")
  return rows


if __name__ == "__main__":
  main(args=_ARGS)
