"""Before booking a TPU: does this config's step compile for that slice, and does it fit?

    python scripts/tpu_check.py --config configs/text/simple.py --slice v5e-8
    python scripts/tpu_check.py --config configs/listops/transformer.py --slice v4-8 \\
        --config.model.dtype=bfloat16 --config.model.attention_kwargs.implementation=flash
    python scripts/tpu_check.py --config configs/listops/simple.py --slice v5e-8 --all_widths
    python scripts/tpu_check.py --config configs/image/simple.py --slice v6e-8 --steps eval

Compiles, on this machine and without a TPU (``libtpu`` installed: ``pip install -e
".[tpu]"``), the pmapped train and eval steps that ``train.py`` runs (``--steps eval``: only
``eval.py``'s step) for every chip of ``--slice``, with the config's dtype and options
(:mod:`simpletron_jax.tools.tpu_aot`). By default it compiles the widest batch (``model.max_length``
tokens), which bounds the memory; ``--all_widths`` loads the data and compiles every padded
width the run meets. Prints per chip: argument, output, temporary and code bytes, the peak
against the chip's HBM, and XLA's FLOPs and bytes accessed per step.

Exit status: 0 when every step compiles and fits; 1 with one line naming the config when one
does not compile or does not fit; 2 for a usage error (unknown slice, task, config field). A
flag absl refuses (a missing ``--config``, an unknown flag, a bad value) ends with one line,
``tpu_check.py: <cause>``, and status 1 (:func:`simpletron_jax.runtime.cli.parse_flags`).
"""

from __future__ import annotations

import json
import os
import sys

from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Only compiling happens here: keep JAX off any local accelerator (and libtpu's chip lock).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
from simpletron_jax.runtime import cli  # noqa: E402  pylint: disable=wrong-import-position

config_flags.DEFINE_config_file("config", None, "A configs/<task>/<model>.py[:variant] file.",
                                lock_config=True)
flags.DEFINE_string("slice", "v5e-8", "TPU slice, e.g. v4-8, v5e-8, v6e-8, v5e-16 (the keys of "
                    "simpletron_jax.tools.tpu_aot.SLICES), or a libtpu topology such as v5e:2x4.")
flags.DEFINE_list("steps", ["train", "eval"], "Which steps: train, eval (eval.py's step).")
flags.DEFINE_bool("all_widths", False, "Load the data and compile every padded width the run "
                  "meets (one program per length bucket), not only the widest.")
flags.DEFINE_string("json", None, "Also write the report as JSON to this file.")
flags.mark_flags_as_required(["config"])


def _gib(n) -> str:
  return "-" if n is None else f"{n / (1 << 30):.3f}"


def print_report(report: dict) -> None:
  """A table of the report's compiles: one row per (step, width), bytes in GiB per chip."""
  print(f"{report['slice']} ({report['topology']}): {report['devices']} x "
        f"{report['device_kind']} over {report['processes']} host(s), "
        f"HBM {_gib(report['hbm_bytes'])} GiB per chip; {report['task']}/"
        f"{report['attention']} {report['dtype']}")
  print(f"{'step':5} {'width':>6} {'rows/chip':>9} {'args':>7} {'outputs':>7} {'aliased':>7} "
        f"{'temp':>7} {'code':>6} {'peak GiB':>8} {'fits':>4} {'GFLOP':>9} {'GB moved':>8} "
        f"{'compile s':>9}")
  for r in report["compiles"]:
    if "error" in r:
      print(f"{r['step']:5} {r['width']:>6} {r['rows_per_device']:>9}  does not compile: "
            f"{r['error']}")
      continue
    print(f"{r['step']:5} {r['width']:>6} {r['rows_per_device']:>9} "
          f"{_gib(r['argument_bytes']):>7} {_gib(r['output_bytes']):>7} "
          f"{_gib(r['alias_bytes']):>7} {_gib(r['temp_bytes']):>7} "
          f"{_gib(r['generated_code_bytes']):>6} {_gib(r['peak_bytes']):>8} "
          f"{'yes' if r['fits'] else 'NO':>4} {r['flops'] / 1e9:>9.1f} "
          f"{r['bytes_accessed'] / 1e9:>8.2f} {r['compile_seconds']:>9.1f}")


def main(argv):
  """Compiles, prints, exits 0 (fits) or 1 (does not compile or fit); see the module doc."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  from simpletron_jax.data import tasks  # pylint: disable=import-outside-toplevel
  from simpletron_jax.tools import tpu_aot  # pylint: disable=import-outside-toplevel
  config = flags.FLAGS.config
  try:
    widths = None
    if flags.FLAGS.all_widths:
      devices = tpu_aot.slice_devices(flags.FLAGS.slice)
      widths = tpu_aot.step_widths(config, tasks.load_task(tasks.data_config(config)),
                                   len(devices))
      print(f"widths met: train {widths['train']}, eval {widths['eval']}", file=sys.stderr)
    report = tpu_aot.compile_report(
        config, flags.FLAGS.slice, steps=flags.FLAGS.steps, widths=widths,
        on_compiled=lambda r: print(f"compiled {r['step']} step at width {r['width']} in "
                                    f"{r['compile_seconds']} s", file=sys.stderr))
  except (tpu_aot.TpuCheckError, ValueError, FileNotFoundError) as e:
    print(f"tpu_check.py: {e}", file=sys.stderr)
    raise SystemExit(2) from None
  print_report(report)
  for reason in sorted({f for r in report["compiles"] for f in r.get("fallbacks", [])}):
    print(f"note: {reason}")
  if flags.FLAGS.json:
    with open(flags.FLAGS.json, "w") as f:
      json.dump(report, f, indent=2)
  line = tpu_aot.summary_line(report)
  print(line)
  if not report["ok"]:
    raise SystemExit(1)


def parse_flags(argv):
  """absl's flag parsing with one-line errors and status 1
  (:func:`simpletron_jax.runtime.cli.parse_flags`)."""
  return cli.parse_flags(argv, "tpu_check.py")


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
