"""The paper configs compiled for TPU slices without a TPU: fits or not, GiB per chip.

    python benchmarks/tpu_aot_table.py --out benchmarks/results/tpu-aot   # the committed table
    python benchmarks/tpu_aot_table.py --only listops        # rows whose name contains it
    python benchmarks/tpu_aot_table.py --list                # the rows, nothing compiled

Each row compiles ``train.py``'s pmapped train step (the widest batch, ``model.max_length``
tokens; state donated as in training) of a paper config for one slice with
:func:`simpletron_jax.tools.tpu_aot.compile_report`, and records XLA's per-chip memory and the
verdict. A paper-size compile takes one to three minutes on a 2-core CPU, so results are
appended to ``<out>/table.json`` (``--out``, default ``runs/benchmarks/tpu-aot``; the committed
table: ``--out benchmarks/results/tpu-aot``) after every row and a rerun skips the
rows already there; ``table.md`` is rewritten from the JSON each time.

Rows (issue 37), the most asked-for first, since one row takes 2 to 6 minutes here:
``transformer`` and ``simple`` on every task on v5e-8 in bfloat16; on ListOps and text,
``transformer`` with ``implementation=flash`` (the Pallas TPU kernel), float32, and v4-8; one
multi-host slice (v5e-16: 4 hosts); ``linear`` and ``performer`` on every task; then v6e-8
and float32 on v5e-8 for every model on ListOps and text, v4-8 for every model and task,
float32 on v4-8 and v6e-8 for ``transformer`` and ``simple``, and flash on the other tasks
and slices.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Only compiling happens here: keep JAX off any local accelerator (and libtpu's chip lock).
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from simpletron_jax.data import tasks as task_registry  # noqa: E402  pylint: disable=C0413
from simpletron_jax.runtime import cli  # noqa: E402  pylint: disable=C0413

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runs",
                   "benchmarks", "tpu-aot")
# The committed table, written only when named: --out benchmarks/results/tpu-aot.
TASKS = task_registry.lra_tasks()   # LRA's six, in Table 1's order
MODELS = ("transformer", "simple", "linear", "performer")


def rows() -> list[dict]:
  """Every row of the table, in the order they are compiled (the most asked-for first)."""
  out = []
  def add(task, model, slice_name, dtype="bfloat16", flash=False, grad_accum_steps=1):
    row = dict(task=task, model=model, slice=slice_name, dtype=dtype, flash=flash,
               grad_accum_steps=grad_accum_steps)
    if row not in out:
      out.append(row)
  pair = ("transformer", "simple")
  for task in TASKS:              # the published comparison, on the cheapest 8-chip slice
    for model in pair:
      add(task, model, "v5e-8")
  add("pathx", "transformer", "v5e-8", flash=True)      # does not fit without: what does?
  add("pathx", "transformer", "v5e-8", grad_accum_steps=2)
  for task in ("listops", "text"):
    add(task, "transformer", "v5e-8", flash=True)
    for model in pair:
      add(task, model, "v5e-8", "float32")
      add(task, model, "v4-8")
  add("text", "simple", "v5e-16")  # 4 hosts
  for task in TASKS:
    for model in ("linear", "performer"):
      add(task, model, "v5e-8")
  for task in ("listops", "text"):
    add(task, "transformer", "v4-8", flash=True)
    add(task, "transformer", "v6e-8", flash=True)
    for model in MODELS:
      add(task, model, "v6e-8")
      add(task, model, "v5e-8", "float32")
  for task in TASKS:
    for model in MODELS:
      add(task, model, "v4-8")
  for task in ("listops", "text"):   # float32 on the other slices: the published pair only
    for model in pair:
      add(task, model, "v4-8", "float32")
      add(task, model, "v6e-8", "float32")
  for slice_name in ("v5e-8", "v4-8", "v6e-8"):
    for task in TASKS[2:]:
      add(task, "transformer", slice_name, flash=True)
  for row in out:
    accum = f" accum{row['grad_accum_steps']}" if row["grad_accum_steps"] > 1 else ""
    row["name"] = (f"{row['task']}/{row['model']}{'+flash' if row['flash'] else ''} "
                   f"{row['dtype']} {row['slice']}{accum}")
  return out


def config_of(row: dict):
  """The paper config of a row, with its dtype (and ``flash``)."""
  import importlib  # pylint: disable=import-outside-toplevel
  config = importlib.import_module(f"configs.{row['task']}.{row['model']}").get_config(None)
  config.model.dtype = row["dtype"]
  config.grad_accum_steps = row.get("grad_accum_steps", 1)
  if row.get("flash"):   # the fused kernels have no attention dropout (else: einsum)
    config.model.attention_kwargs.implementation = "flash"
    config.model.attention_dropout_rate = 0.0
  return config


def command(row: dict) -> str:
  """The ``scripts/tpu_check.py`` command that checks the row (train and eval steps)."""
  extra = (" --config.model.attention_kwargs.implementation=flash"
           " --config.model.attention_dropout_rate=0" if row.get("flash") else "")
  if row.get("grad_accum_steps", 1) > 1:
    extra += f" --config.grad_accum_steps={row['grad_accum_steps']}"
  return (f"python scripts/tpu_check.py --config configs/{row['task']}/{row['model']}.py "
          f"--slice {row['slice']} --config.model.dtype={row['dtype']}{extra}")


def _short_error(error: str) -> str:
  """The compiler's verdict without its boilerplate: for an HBM OOM, the bytes needed and
  available (``... temporaries (16.05G) exceeds available HBM (15.75G)``)."""
  oom = re.search(r"(total memory required for .*? exceeds available HBM \([^)]*\))", error)
  return f"HBM OOM: {oom.group(1)}" if oom else error[:200]


def write_markdown(results: list[dict], path: str) -> None:
  """``table.md``: one line per row, GiB per chip, the verdict or the compiler's error."""
  lines = ["# Paper configs compiled for TPU slices on a CPU host (no TPU)", "",
           "Made by `python benchmarks/tpu_aot_table.py` (jax and libtpu versions in "
           "`table.json`). The train step of `train.py` at the widest batch "
           "(`model.max_length` tokens), per chip: peak = arguments + outputs - donated + "
           "temporaries + code, against the chip's HBM (`simpletron_jax/tools/tpu_aot.py`, "
           "`HBM_BYTES`). `flash`: the Pallas TPU flash-attention kernel, run with "
           "`attention_dropout_rate=0` (it has no attention dropout); XLA's FLOP count leaves "
           "its custom calls out. Check one row yourself with the `scripts/tpu_check.py` "
           "command in `table.json`.", "",
           "| task | model | dtype | slice | rows/chip | temp GiB | peak GiB | HBM GiB | fits "
           "| TFLOP/step/chip | compile s |",
           "|---|---|---|---|---:|---:|---:|---:|---|---:|---:|"]
  notes = []
  for r in results:
    c = r["report"]["compiles"][0] if r["report"].get("compiles") else {}
    model = r["model"] + (" +flash" if r.get("flash") else "") + (
        f" (grad_accum_steps={r['grad_accum_steps']})" if r.get("grad_accum_steps", 1) > 1
        else "")
    for reason in c.get("fallbacks", []):
      notes.append(f"- {r['name']}: {reason}")
    hbm = r["report"].get("hbm_bytes")
    if "error" in c or not c:
      lines.append(f"| {r['task']} | {model} | {r['dtype']} | {r['slice']} | "
                   f"{c.get('rows_per_device', '')} | | | {hbm / 2**30:.0f} | **no**: "
                   f"{_short_error(c.get('error', r['report'].get('error', '')))} | | "
                   f"{c.get('compile_seconds', '')} |")
      continue
    lines.append(f"| {r['task']} | {model} | {r['dtype']} | {r['slice']} | "
                 f"{c['rows_per_device']} | {c['temp_bytes'] / 2**30:.2f} | "
                 f"{c['peak_bytes'] / 2**30:.2f} | {hbm / 2**30:.0f} | "
                 f"{'yes' if c['fits'] else '**no**'} | {c['flops'] / 1e12:.2f} | "
                 f"{c['compile_seconds']} |")
  if notes:
    lines += ["", "Implementations replaced while the step was traced "
              "(`softmax.log_fallback_once`):", ""] + notes
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")


def main() -> None:
  """Compiles the rows not yet in ``table.json`` (see the module doc)."""
  parser = cli.ArgumentParser(prog="tpu_aot_table.py", description=__doc__.splitlines()[0])
  parser.add_argument("--only", default="", help="only rows whose name contains this")
  parser.add_argument("--skip", default="", help="leave out rows whose name contains this")
  parser.add_argument("--list", action="store_true", help="print the rows and stop")
  parser.add_argument("--out", default=OUT, help="output folder (default runs/benchmarks/"
                      "tpu-aot; the committed table: --out benchmarks/results/tpu-aot)")
  args = parser.parse_args()
  todo = [r for r in rows()
          if args.only in r["name"] and not (args.skip and args.skip in r["name"])]
  if args.list:
    for r in todo:
      print(r["name"])
    return
  import jax  # pylint: disable=import-outside-toplevel
  from simpletron_jax.tools import tpu_aot  # pylint: disable=import-outside-toplevel
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "table.json")
  results = json.load(open(path))["rows"] if os.path.exists(path) else []
  done = {r["name"] for r in results}
  import importlib.metadata as md  # pylint: disable=import-outside-toplevel
  versions = {"jax": jax.__version__, "libtpu": md.version("libtpu")}
  for row in todo:
    if row["name"] in done:
      continue
    start = time.time()
    try:
      report = tpu_aot.compile_report(config_of(row), row["slice"], steps=("train",))
    except ValueError as e:   # a config that does not split over the slice
      report = {"error": str(e), "compiles": [], "ok": False,
                "hbm_bytes": tpu_aot.hbm_bytes(tpu_aot.slice_devices(row["slice"])[0])}
    results.append({**row, "command": command(row), "report": report})
    print(f"{row['name']}: {tpu_aot.summary_line(report) if 'task' in report else report['error']}"
          f" ({time.time() - start:.0f} s)", flush=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
      json.dump({"versions": versions, "rows": results}, f, indent=1)
    os.replace(tmp, path)
    write_markdown(results, os.path.join(args.out, "table.md"))


if __name__ == "__main__":
  main()
