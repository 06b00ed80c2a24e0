"""Every exact speed option of the train step, timed against the default in one process.

    python benchmarks/speed_options.py --out /tmp/speed_options            # GPU: 4K and 16K
    python benchmarks/speed_options.py --quick --out /tmp/speed_options    # CPU rehearsal

The model and the timing are :mod:`speed_memory`'s (LRA's byte-level text classifier, batch
32, bfloat16 by default; compile every cell of a length first, in threads, then run them one
by one: a warm-up step, a probe step, median of ``--rounds`` timed runs). Each row is one
option on top of its base row (:data:`OPTIONS`): ``simple`` and ``softmax_flash`` as
``speed_memory`` builds them, then each option alone, then the leading set. Each option's
speed-up is its row's steps/s over its base row's at the same length, measured in this run.

Beside each measured speed-up is the one ``benchmarks/hlo_cost.py`` modelled for an H100
(``--model``, default the committed ``hlo_cost.json``), where it modelled that option.

Writes ``speed_options.json`` (``speed_memory``'s payload layout: ``machine``, ``settings``,
``results`` with every record, so ``benchmarks/torch_step.py --jax_results`` reads it too)
and ``speed_options.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from simpletron_jax.runtime import cli  # noqa: E402  pylint: disable=wrong-import-position
from simpletron_jax.runtime import platforms  # noqa: E402  pylint: disable=wrong-import-position
# speed_memory imports JAX: run() and main() import it, so --help and a bad invocation end
# before JAX loads.

_BLOCK = {"block_diagonal": True}


@dataclasses.dataclass(frozen=True)
class Option:
  """One row: ``base`` (a :func:`speed_memory.variant_setup` label) with ``overrides``.

  Attributes:
    label: the row label.
    base: the base row's label; the row whose ``overrides`` are empty is the baseline.
    overrides: ``model.*`` fields on top of the base (``attention_kwargs`` whole).
    modelled: the spec of this option in ``hlo_cost.json``, or None where it was not modelled.
  """
  label: str
  base: str
  overrides: dict[str, Any]
  modelled: str | None = None


OPTIONS = (
    Option("simple", "simple", {}),
    Option("simple+block_diagonal", "simple", {"attention_kwargs": _BLOCK},
           'simple+attention_kwargs={"block_diagonal":true}'),
    Option("simple+last_block_cls_only", "simple", {"last_block_cls_only": True},
           "simple+last_block_cls_only=true"),
    Option("simple+length_multiple=8", "simple", {"length_multiple": 8},
           "simple+length_multiple=8"),
    Option("simple+leading", "simple",
           {"attention_kwargs": _BLOCK, "last_block_cls_only": True, "length_multiple": 8},
           'simple+attention_kwargs={"block_diagonal":true}+last_block_cls_only=true'
           '+length_multiple=8'),
    Option("softmax_flash", "softmax_flash", {}),
    Option("softmax_flash+last_block_cls_only", "softmax_flash",
           {"last_block_cls_only": True}),
    Option("softmax_flash+leading", "softmax_flash",
           {"last_block_cls_only": True, "length_multiple": 8}),
)
DEFAULT_MODEL = os.path.join(HERE, "results", "nvidia-h100-80gb-hbm3", "hlo_cost",
                             "hlo_cost.json")


def modelled_speedups(path: str | None) -> dict[tuple[str, int], float]:
  """``{(spec, length): modelled ms of plain simple / modelled ms of spec}`` from an
  ``hlo_cost.json``; empty when ``path`` is None or missing."""
  if not path or not os.path.exists(path):
    return {}
  with open(path) as f:
    cells = [c for c in json.load(f)["cells"] if c.get("status") == "ok"]
  base = {c["length"]: c["model_ms"] for c in cells if c["spec"] == "simple"}
  return {(c["spec"], c["length"]): base[c["length"]] / c["model_ms"]
          for c in cells if c["length"] in base}


def add_speedups(records: list[dict[str, Any]], options: tuple[Option, ...],
                 modelled: dict[tuple[str, int], float]) -> None:
  """Adds, in place, ``speedup`` (the option's, measured; None where a row did not run) and
  ``modelled_speedup`` (None where not modelled) to each record."""
  by_key = {(r["label"], r["length"]): r for r in records if r["status"] == "ok"}
  spec = {o.label: o for o in options}
  for record in records:
    option = spec[record["label"]]
    base = by_key.get((option.base, record["length"]))
    here = by_key.get((option.label, record["length"]))
    speedup = None
    if base and here:
      speedup = here["steps_per_sec"] / base["steps_per_sec"]
    record["speedup"] = speedup
    record["modelled_speedup"] = modelled.get((option.modelled, record["length"]))


def run(options: tuple[Option, ...], lengths: list[int], batch: int, dtype: str, steps: int,
        rounds: int, run_seconds: float, compile_workers: int,
        model_overrides: dict[str, Any] | None, matmul_n: int | None = None,
        log=print, on_length=None) -> dict[str, Any]:
  """Compiles and runs every option at every length in this process.

  At each length every cell is compiled first (``compile_workers`` threads; a cell whose
  compile raised beside others is compiled again alone), then run one after another
  (:func:`speed_memory.prepare_cell`, :func:`speed_memory.run_cell`). ``matmul_n``: the
  side of the matmul-peak measurement (:func:`speed_memory.machine_info`). ``on_length``,
  if given, is called with the payload so far after each length (a run stopped by a time
  limit keeps its finished lengths).

  Returns:
    ``{"machine", "settings", "results", "wall_s"}``; each record as
    :func:`speed_memory.measure_config` makes it, with ``label`` the option's.
  """
  import concurrent.futures  # pylint: disable=import-outside-toplevel
  import speed_memory  # pylint: disable=import-outside-toplevel
  start = time.perf_counter()
  machine = speed_memory.machine_info(matmul_n)
  limit = speed_memory.default_memory_limit(machine)
  results = []
  payload = {"benchmark": "speed_options", "machine": machine,
             "settings": {"lengths": lengths, "batch": batch, "dtype": dtype, "steps": steps,
                          "rounds": rounds, "run_seconds": run_seconds,
                          "compile_workers": compile_workers,
                          "model_overrides": model_overrides},
             "results": results, "wall_s": 0.0}
  for length in lengths:
    def prepare(option: Option, length=length):
      t0 = time.perf_counter()
      record, cell = speed_memory.prepare_cell(option.base, length, batch, dtype, limit,
                                               {**(model_overrides or {}), **option.overrides})
      return option, record, cell, time.perf_counter() - t0
    with concurrent.futures.ThreadPoolExecutor(max(1, compile_workers)) as pool:
      prepared = list(pool.map(prepare, options))
    # A compile that raised beside others (device memory taken by their autotuning, say) is
    # tried again alone, so compiling side by side cannot change a result.
    prepared = [prepare(p[0]) if "error_type" in p[1] and compile_workers > 1 else p
                for p in prepared]
    for option, record, cell, prepare_s in prepared:
      if cell is not None:
        record = speed_memory.run_cell(cell, steps, rounds, run_seconds)
      record.update(label=option.label, base=option.base, overrides=option.overrides,
                    prepare_wall_s=prepare_s)
      results.append(record)
      log(f"L={length} {option.label}: {record['status']} "
          + (f"{record['steps_per_sec']:.3g} steps/s" if record["status"] == "ok"
             else record["reason"]) + f" (compiled in {prepare_s:.0f} s)")
    payload["wall_s"] = time.perf_counter() - start
    if on_length:
      on_length(payload)
  return payload


def markdown(payload: dict[str, Any]) -> str:
  """The report: one table per length (steps/s, memory, measured and modelled speed-up)."""
  s, machine = payload["settings"], payload["machine"]
  lines = [f"# Speed options of the train step ({machine['device_kind']}, {s['dtype']}, "
           f"batch {s['batch']})", "", f"`{payload['command']}`", "",
           f"jax {machine['jax']}; {payload['created']}; the whole run took "
           f"{payload['wall_s']:.0f} s. Steps/s: median of {s['rounds']} timed runs. "
           "Speed-up: the row over its base row (`simple` or `softmax_flash`), measured in "
           "this run. Modelled: "
           "`benchmarks/hlo_cost.py` for an H100 (blank: not modelled). A `softmax_flash` row that "
           "says 'fell back' ran XLA, not cuDNN.", ""]
  for length in s["lengths"]:
    lines += [f"## L = {length}", "",
              "| row | steps/s | memory GiB | speed-up | modelled | compile s |",
              "|---|---|---|---|---|---|"]
    for r in (r for r in payload["results"] if r["length"] == length):
      ok = r["status"] == "ok"
      fell_back = "; ".join(r.get("fallbacks") or [])
      mem = r.get("memory_bytes")
      lines.append(
          f"| `{r['label']}`{' (fell back: ' + fell_back[:60] + ')' if fell_back else ''} | "
          f"{r['steps_per_sec']:.3g} | " if ok else
          f"| `{r['label']}` | {r['status']}: {r['reason'][:80]} | ")
      lines[-1] += (f"{mem / 2**30:.2f} | " if ok and mem else " | ")
      lines[-1] += (f"{r['speedup']:.2f}x | " if r.get("speedup") else " | ")
      lines[-1] += (f"{r['modelled_speedup']:.2f}x | " if r.get("modelled_speedup") else " | ")
      lines[-1] += f"{r.get('compile_s', 0):.0f} |"
    lines.append("")
  return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
  """The command line (see the module docstring)."""
  p = cli.ArgumentParser(prog="speed_options.py", description=__doc__.split("\n\n")[0])
  p.add_argument("--lengths", type=int, nargs="+", default=None,
                 help="input lengths (default 4096 16384; --quick: 128)")
  p.add_argument("--batch", type=int, default=None, help="global batch (default 32; --quick 2)")
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
  p.add_argument("--steps", type=int, default=10, help="steps per timed run (at most)")
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--run_seconds", type=float, default=1.0,
                 help="cut a slow cell's timed runs to about this many seconds (0: off)")
  p.add_argument("--compile_workers", type=int, default=8)
  p.add_argument("--only", nargs="+", default=None, help="these row labels (and their bases)")
  p.add_argument("--model", default=DEFAULT_MODEL, help="hlo_cost.json of the modelled column")
  p.add_argument("--cache_dir", default="/tmp/jax_cache", help="'' to disable")
  p.add_argument("--quick", action="store_true",
                 help="CPU rehearsal: 1 layer of emb 32, length 128, batch 2, 2 steps")
  p.add_argument("--out", required=True)
  return p.parse_args(argv)


def main(argv=None) -> dict[str, Any]:
  """Runs the options, writes ``speed_options.{json,md}`` to ``--out``, prints the report.

  Raises:
    SystemExit: for an unknown ``--only`` label, and (after writing) when no cell ran.
  """
  args = parse_args(argv)
  import speed_memory  # pylint: disable=import-outside-toplevel
  platforms.skip_absent_tpu()
  options = OPTIONS
  if args.only:
    unknown = sorted(set(args.only) - {o.label for o in OPTIONS})
    if unknown:
      raise SystemExit(f"--only: unknown rows {unknown}; known: {[o.label for o in OPTIONS]}")
    wanted = set(args.only) | {o.base for o in OPTIONS if o.label in args.only}
    options = tuple(o for o in OPTIONS if o.label in wanted)
  speed_memory.enable_compilation_cache(args.cache_dir)
  tiny = ({"num_layers": 1, "emb_dim": 32, "qkv_dim": 32, "mlp_dim": 64, "num_heads": 4}
          if args.quick else None)
  command = "python " + shlex.join([sys.argv[0], *(sys.argv[1:] if argv is None else argv)])
  modelled = modelled_speedups(args.model)

  def write(payload: dict[str, Any]) -> str:
    payload.update(command=command,
                   created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    add_speedups(payload["results"], options, modelled)
    os.makedirs(args.out, exist_ok=True)
    text = markdown(payload)
    with open(os.path.join(args.out, "speed_options.json"), "w") as f:
      json.dump(payload, f, indent=1, default=str)
    with open(os.path.join(args.out, "speed_options.md"), "w") as f:
      f.write(text + "\n")
    return text

  payload = run(options, args.lengths or ([128] if args.quick else [4096, 16384]),
                args.batch or (2 if args.quick else 32), args.dtype,
                2 if args.quick else args.steps, args.rounds, args.run_seconds,
                args.compile_workers, tiny, matmul_n=64 if args.quick else None,
                log=lambda line: print(line, file=sys.stderr, flush=True), on_length=write)
  print(write(payload))
  if not any(r["status"] == "ok" for r in payload["results"]):
    raise SystemExit("speed_options: no cell ran; the reasons are in speed_options.md")
  return payload


if __name__ == "__main__":
  main()
