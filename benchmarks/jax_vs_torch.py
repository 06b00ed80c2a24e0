"""JAX against PyTorch on the benchmark model, in one process, with the steps interleaved.

    taskset -c 1 python benchmarks/jax_vs_torch.py --variants simple softmax_xla \
        --lengths 1024 --batch 2 --dtype float32 --rounds 15 --out /tmp/jax_vs_torch
    python benchmarks/jax_vs_torch.py --variants simple softmax_flash --lengths 4096 \
        --dtype bfloat16 --steps 10                                       # a GPU

A speed ratio between two processes run minutes apart is only as good as the machine is quiet.
On the shared 2-core development machine one cell varied by about 12% between processes, and
JAX against PyTorch measured 0.58x to 0.72x that way (``torch_step.md``, ``dropout_cost.md``)
where this script measured 0.85x. Here every round times ``--steps`` JAX steps, then
``--steps`` PyTorch steps (the order alternates by round), each run synchronised on its own, so
a slow spell of the machine hits both alike. Reported: each framework's median per-step time
and JAX's speed relative to PyTorch (PyTorch's median over JAX's; above 1 JAX is faster).

Rows: for each ``speed_memory.py`` row label in ``--variants`` (``simple``, ``softmax_xla``,
``softmax_flash``, ...), the JAX step is that row's full pmapped train step, compiled ahead of
time, on a resident random full-length byte batch; the PyTorch model is
``torch_step.TextClassifier`` with ``simple`` attention for the Simple family and ``softmax``
(``scaled_dot_product_attention``) otherwise, in eager mode (``--torch_mode compile`` for
``torch.compile``), with the JAX row's dropout and attention dropout. The PyTorch model starts
from the JAX parameters (``torch_step.load_flax_params``), so both train the same function from
the same point (only ``simple`` and ``softmax`` rows without fallbacks are the same function;
``tests/test_torch_reference.py`` checks them). ``--set FIELD=VALUE`` changes ``model.*`` of
the JAX config (the sizes also reach the PyTorch model, e.g. for tests).

On a GPU both frameworks share the memory, so JAX's preallocation is turned off here
(``XLA_PYTHON_CLIENT_PREALLOCATE=false`` unless set). Writes ``jax_vs_torch.json`` (settings,
both machines, every record with every timed run) and ``jax_vs_torch.md`` to ``--out``.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import speed_memory as sm  # noqa: E402
import torch_step  # noqa: E402
from simpletron_jax.model import encoders  # noqa: E402
from simpletron_jax.runtime import cli  # noqa: E402
from simpletron_jax.train import run_config, train_state  # noqa: E402
from simpletron_jax.train.steps import pmap_steps, replicate, unreplicate  # noqa: E402


def torch_kind(label: str) -> str:
  """The ``torch_step`` attention for a JAX row label: ``simple`` for the Simple family
  (``simple``, ``simple_res``, ...), else ``softmax``."""
  return "simple" if label.startswith("simple") else "softmax"


def _jax_cell(label: str, length: int, batch: int, dtype: str, overrides: dict[str, Any]):
  """``(config, state, compiled step, resident batch)`` of one JAX row."""
  setup = sm.variant_setup(label, length)
  config = sm.lra_text_config(length, setup.attention, setup.attention_kwargs, batch, dtype,
                              {**setup.model_overrides, **overrides})
  model = encoders.build_classifier(config.model, vocab_size=sm.BYTE_VOCAB,
                                    num_classes=sm.NUM_CLASSES)
  state = replicate(train_state.create_train_state(
      run_config.TrainConfig.from_config_dict(config), model, jax.random.PRNGKey(0),
      config.model.max_length))
  p_train, _ = pmap_steps(model.apply)
  data = sm._device_batch(batch, length, jax.local_device_count())  # pylint: disable=protected-access
  compiled = p_train.lower(state, data, jax.random.PRNGKey(0)).compile()
  return config, state, compiled, data


def measure_pair(label: str, length: int, batch: int, dtype: str, steps: int, rounds: int,
                 device: torch.device, torch_mode: str = "eager",
                 overrides: dict[str, Any] | None = None) -> dict[str, Any]:
  """Times one row's JAX step and its PyTorch counterpart, interleaved.

  Args:
    label: a ``speed_memory.py`` row label.
    length: tokens per example, CLS excluded.
    batch: examples per step.
    dtype: ``"float32"`` or ``"bfloat16"`` (JAX ``model.dtype``; PyTorch autocast).
    steps: steps per framework per round, synchronised once.
    rounds: rounds; medians over them are reported.
    device: PyTorch's device (JAX uses its default backend).
    torch_mode: ``"eager"`` or ``"compile"``.
    overrides: ``model.*`` fields for the JAX config (sizes reach PyTorch too).

  Returns:
    A record: ``label``, ``torch_label``, ``length``, ``status`` (``ok``, ``OOM`` or
    ``error``), ``reason``, and when ok ``jax_s`` and ``torch_s`` (seconds per step of every
    round), their medians ``jax_median_s`` and ``torch_median_s``, ``jax_speed_vs_torch``
    (``torch_median_s / jax_median_s``), and each side's final loss; a non-finite final
    loss makes the cell an ``error``. Never raises for a failing cell.
  """
  kind = torch_kind(label)
  record: dict[str, Any] = {"label": label, "torch_label": f"torch_{kind}_{torch_mode}",
                            "length": length, "batch": batch, "status": "error", "reason": ""}
  state = compiled = data = tmodel = tstep = None
  try:
    config, state, compiled, data = _jax_cell(label, length, batch, dtype, overrides or {})
    m = config.model
    sizes = {f: m[f] for f in torch_step.MODEL}
    torch.manual_seed(0)
    tmodel = torch_step.TextClassifier(kind, sm.BYTE_VOCAB, sm.NUM_CLASSES, length,
                                       attention_dropout_rate=m.attention_dropout_rate,
                                       **sizes).to(device)
    torch_step.load_flax_params(tmodel, jax.device_get(unreplicate(state).params))
    host = sm._host_batch(batch, length, 1)  # pylint: disable=protected-access
    tokens = torch.from_numpy(host["inputs"][0].astype(np.int64)).to(device)
    targets = torch.from_numpy(host["targets"][0].astype(np.int64)).to(device)
    tstep = torch_step.make_step(tmodel, torch_mode, dtype, device)
    keys = jax.random.split(jax.random.PRNGKey(1), (rounds + 1) * steps)

    def run_jax(r):
      nonlocal state
      start = time.perf_counter()
      for i in range(steps):
        state, sums = compiled(state, data, keys[r * steps + i])
      jax.block_until_ready((state, sums))
      return (time.perf_counter() - start) / steps, sums

    def run_torch():
      start = time.perf_counter()
      for _ in range(steps):
        loss = tstep(tokens, targets)
      torch_step._synchronize(device)  # pylint: disable=protected-access
      return (time.perf_counter() - start) / steps, loss

    run_jax(rounds)     # warm-up (the JAX step is compiled already)
    run_torch()         # warm-up (compiles in compile mode)
    jax_s, torch_s = [], []
    for r in range(rounds):
      if r % 2 == 0:
        (t_jax, sums), (t_torch, loss) = run_jax(r), run_torch()
      else:
        (t_torch, loss), (t_jax, sums) = run_torch(), run_jax(r)
      jax_s.append(t_jax)
      torch_s.append(t_torch)
    jax_median, torch_median = statistics.median(jax_s), statistics.median(torch_s)
    losses = {"jax_final_loss": float(np.asarray(sums["metrics"].loss.total)[0]
                                      / np.asarray(sums["metrics"].loss.count)[0]),
              "torch_final_loss": float(loss)}
    record.update(jax_s=jax_s, torch_s=torch_s, jax_median_s=jax_median,
                  torch_median_s=torch_median, jax_speed_vs_torch=torch_median / jax_median,
                  **losses)
    bad = [name for name, value in losses.items() if not np.isfinite(value)]
    record.update(status="error" if bad else "ok",
                  reason=f"non-finite {', '.join(bad)}" if bad else "")
  except Exception as error:  # noqa: BLE001  (any failure is this cell's result)
    record.update(status="OOM" if sm._is_oom(error) else "error",  # pylint: disable=protected-access
                  reason=sm._first_line(error))  # pylint: disable=protected-access
  finally:   # free both frameworks' buffers before the next cell
    state = compiled = data = tmodel = tstep = None
    if device.type == "cuda":
      torch.cuda.empty_cache()
  return record


def markdown_report(payload: dict[str, Any]) -> str:
  """The ``jax_vs_torch.md`` table: per row and length, both medians and the ratio."""
  s = payload["settings"]
  lines = [
      "# JAX against PyTorch, interleaved in one process", "",
      f"Created {payload['created']}; jax {payload['jax']['jax']} on "
      f"{payload['jax']['device_kind']}, torch {payload['torch']['torch']} on "
      f"{payload['torch']['device_name']}.", "",
      f"Model: the benchmark's LRA text model ({s['model_sizes']}), batch {s['batch']}, "
      f"{s['dtype']}, full train step (forward, backward, AdamW); PyTorch {s['torch_mode']}. "
      f"{s['rounds']} rounds of {s['steps']} step(s) per framework, the order alternating by "
      "round; medians of the per-step times.", "",
      f"Command: `{payload['command']}`", "",
      "| JAX row | PyTorch | length | JAX s/step | PyTorch s/step | JAX speed vs PyTorch |",
      "|---|---|---|---|---|---|"]
  for r in payload["results"]:
    if r["status"] == "ok":
      lines.append(f"| `{r['label']}` | `{r['torch_label']}` | {r['length']} | "
                   f"{r['jax_median_s']:.4g} | {r['torch_median_s']:.4g} | "
                   f"{r['jax_speed_vs_torch']:.2f}x |")
    else:
      lines.append(f"| `{r['label']}` | `{r['torch_label']}` | {r['length']} | "
                   f"{r['status']}: {r['reason'][:80]} | | |")
  return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
  """Command line: see the module docstring. Returns the JSON payload.

  Raises:
    ValueError: for an unknown row label in ``--variants``.
    SystemExit: (after writing the outputs) when no cell ran, so a run that measured nothing
      does not exit 0.
  """
  parser = cli.ArgumentParser(prog="jax_vs_torch.py",
                              description=__doc__.split("\n", maxsplit=1)[0])
  parser.add_argument("--variants", nargs="+", default=["simple", "softmax_xla"],
                      help="speed_memory.py row labels")
  parser.add_argument("--lengths", nargs="+", type=int, default=[1024])
  parser.add_argument("--batch", type=int, default=2)
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
  parser.add_argument("--steps", type=int, default=1, help="steps per framework per round")
  parser.add_argument("--rounds", type=int, default=10)
  parser.add_argument("--torch_mode", choices=torch_step.MODES, default="eager")
  parser.add_argument("--device", default=None, help="PyTorch device (default: cuda if any)")
  parser.add_argument("--set", nargs="+", default=(), metavar="FIELD=VALUE",
                      help="model.* overrides of the JAX config, as in speed_memory.py")
  parser.add_argument("--out", required=True)
  args = parser.parse_args(argv)
  if args.steps < 1 or args.rounds < 1:
    parser.error("--steps and --rounds must be at least 1")
  for label in args.variants:
    sm.variant_setup(label, args.lengths[0])   # unknown labels fail before any work
  device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
  overrides = sm.parse_overrides(args.set)
  results = []
  for label in args.variants:
    for length in args.lengths:
      record = measure_pair(label, length, args.batch, args.dtype, args.steps, args.rounds,
                            device, args.torch_mode, overrides)
      print(f"{label} L={length}: {record['status']} "
            + (f"JAX {record['jax_median_s']:.4g} s, PyTorch {record['torch_median_s']:.4g} s, "
               f"JAX {record['jax_speed_vs_torch']:.2f}x" if record["status"] == "ok"
               else record["reason"]), flush=True)
      results.append(record)
  base = sm.lra_text_config(args.lengths[0], "simple", {}, args.batch, args.dtype, overrides)
  jax_device = jax.local_devices()[0]
  payload = {
      "benchmark": "jax_vs_torch",
      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "command": "python benchmarks/jax_vs_torch.py " + shlex.join(
          argv if argv is not None else sys.argv[1:]),
      "settings": {"variants": args.variants, "lengths": args.lengths, "batch": args.batch,
                   "dtype": args.dtype, "steps": args.steps, "rounds": args.rounds,
                   "torch_mode": args.torch_mode, "overrides": overrides,
                   "model_sizes": ", ".join(f"{f} {base.model[f]}" for f in torch_step.MODEL)},
      "jax": {"jax": jax.__version__, "platform": jax_device.platform,
              "device_kind": jax_device.device_kind, "n_devices": jax.local_device_count()},
      "torch": torch_step.machine_info(device),
      "results": results,
  }
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "jax_vs_torch.json"), "w") as f:
    json.dump(payload, f, indent=2)
  text = markdown_report(payload)
  with open(os.path.join(args.out, "jax_vs_torch.md"), "w") as f:
    f.write(text)
  print(text)
  if not any(r["status"] == "ok" for r in results):
    raise SystemExit("jax_vs_torch: no cell ran; see the reasons in "
                     + os.path.join(args.out, "jax_vs_torch.md"))
  return payload


if __name__ == "__main__":
  main()
