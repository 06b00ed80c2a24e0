"""Training-step time of several configs at fixed lengths, measured in one process.

    python benchmarks/step_time.py --configs configs/listops/simple.py:tiny_lra \
        configs/listops/transformer.py:tiny_lra --lengths 1024 2000 --out benchmarks/results/cpu
    python benchmarks/step_time.py --configs configs/text/simple.py \
        configs/text/simple.py,model.length_multiple=8 --lengths 1024 --batch 2

A spec is ``path.py[:variant]`` followed by optional ``,dotted.field=value`` overrides of the
config (values parsed as Python literals, else kept as strings).

Each measurement is the real pmapped train step (forward, backward, AdamW) on
a batch of random tokens without padding (every row is exactly ``length``
tokens). Configs are timed in interleaved rounds, so a slow spell of a shared
machine hits all of them alike; the table reports the median seconds per step
and each config's time relative to the first. Writes ``step_time.json`` and
``step_time.md`` to ``--out`` (default ``runs/benchmarks/cpu``; ``benchmarks/results/cpu`` only
when named).
"""

import argparse
import ast
import importlib.util
import json
import os
import shlex
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from simpletron_jax.runtime import cli  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
  """The command line (see the module docstring)."""
  parser = cli.ArgumentParser(prog="step_time.py", description=__doc__.split("\n", maxsplit=1)[0])
  parser.add_argument("--configs", nargs="+", required=True, help="path.py[:variant] ...")
  parser.add_argument("--lengths", nargs="+", type=int, default=[1024, 2000])
  parser.add_argument("--batch", type=int, default=None, help="default: config.batch_size")
  parser.add_argument("--rounds", type=int, default=5, help="timed steps per config and length")
  parser.add_argument("--vocab", type=int, default=16)
  parser.add_argument("--out", default=os.path.join(ROOT, "runs", "benchmarks", "cpu"),
                      help="output folder (default runs/benchmarks/cpu; the committed tables: "
                      "--out benchmarks/results/cpu)")
  return parser.parse_args(argv)


if __name__ == "__main__":
  # The flags first: --help and a bad invocation end here, before the imports below load JAX.
  _ARGS = parse_args()

import jax  # noqa: E402
import numpy as np  # noqa: E402

from simpletron_jax.model import encoders  # noqa: E402
from simpletron_jax.train import run_config, steps, train_state  # noqa: E402


def load_config(spec: str):
  """Loads ``path.py[:variant][,dotted.field=value...]`` the way train.py's ``--config`` and
  ``--config.<field>`` flags do.

  Raises:
    ValueError: for an override without ``=`` or naming a field the config lacks.
  """
  path_variant, *overrides = spec.split(",")
  path, _, variant = path_variant.partition(":")
  module_spec = importlib.util.spec_from_file_location("bench_config", os.path.join(ROOT, path))
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  config = module.get_config(variant or None)
  for item in overrides:
    field, sep, text = item.partition("=")
    *parents, leaf = field.split(".")
    node = config
    for name in parents:
      node = node.get(name) if hasattr(node, "get") else None
    if not sep or node is None or leaf not in node:
      raise ValueError(f"config spec {spec!r}: {item!r} is not FIELD=VALUE for a field of "
                       f"{path}")
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = text
    node[leaf] = value
  return config


def random_batch(rng, batch_size: int, length: int, vocab: int, n_dev: int,
                 num_classes: int = 10):
  """A ``[n_dev, batch_size / n_dev, length]`` batch of random real tokens (ids 1..vocab-1)
  and random labels in ``[0, num_classes)``."""
  return steps.shard({
      "inputs": rng.integers(1, vocab, (batch_size, length)).astype(np.int32),
      "mask": np.ones((batch_size, length), bool),
      "targets": rng.integers(0, num_classes, batch_size).astype(np.int32),
      "weights": np.ones(batch_size, np.float32)}, n_dev)


def main(args: argparse.Namespace | None = None):
  """Command line: times the train step of each config at each length; see the module docstring.
  ``args``: the flags already parsed (:func:`parse_args`; default: parsed from ``sys.argv``)."""
  args = parse_args() if args is None else args

  n_dev = jax.local_device_count()
  runs = []
  for spec in args.configs:
    config = load_config(spec)
    model = encoders.build_classifier(config.model, vocab_size=args.vocab, num_classes=10)
    state = steps.replicate(
        train_state.create_train_state(
            run_config.TrainConfig.from_config_dict(config), model, jax.random.PRNGKey(0),
            config.model.max_length))
    p_train, _ = steps.pmap_steps(model.apply)
    runs.append({"spec": spec, "config": config, "state": state, "p_train": p_train,
                 "batch_size": args.batch or config.batch_size})

  rows = []
  rng = np.random.default_rng(0)
  for length in args.lengths:
    times = {run["spec"]: [] for run in runs}
    for run in runs:
      if length > run["config"].model.max_length:
        raise ValueError(f"{run['spec']}: length {length} > model.max_length")
      run["batch"] = random_batch(rng, run["batch_size"], length, args.vocab, n_dev)
      run["state"], sums = run["p_train"](run["state"], run["batch"], jax.random.PRNGKey(0))
      jax.block_until_ready(sums)  # compile and warm up
    for i in range(args.rounds):
      for run in runs:
        start = time.perf_counter()
        run["state"], sums = run["p_train"](run["state"], run["batch"], jax.random.PRNGKey(i))
        jax.block_until_ready(sums)
        times[run["spec"]].append(time.perf_counter() - start)
    base = statistics.median(times[runs[0]["spec"]])
    for run in runs:
      median = statistics.median(times[run["spec"]])
      rows.append({"config": run["spec"], "attention": run["config"].model.attention,
                   "length": length, "batch": run["batch_size"], "median_s_per_step": median,
                   "steps_per_sec": 1.0 / median, "time_ratio_to_first": median / base,
                   "all_s": times[run["spec"]]})

  os.makedirs(args.out, exist_ok=True)
  device = jax.devices()[0]
  header = {"device": f"{device.platform}:{device.device_kind}", "n_devices": n_dev,
            "cpu_count": os.cpu_count(), "rounds": args.rounds, "jax": jax.__version__,
            "command": shlex.join(["python", "benchmarks/step_time.py", *sys.argv[1:]])}
  with open(os.path.join(args.out, "step_time.json"), "w") as f:
    json.dump({**header, "rows": rows}, f, indent=2)
  lines = [f"Train-step time on {header['device']} x{n_dev} ({os.cpu_count()} CPUs), median of "
           f"{args.rounds} interleaved steps.", "",
           "| config | length | batch | s/step | steps/s | time vs first |",
           "|---|---|---|---|---|---|"]
  lines += [f"| {r['config']} | {r['length']} | {r['batch']} | {r['median_s_per_step']:.3f} | "
            f"{r['steps_per_sec']:.2f} | {r['time_ratio_to_first']:.2f}x |" for r in rows]
  lines += ["", f"Command: `{header['command']}`"]
  table = "\n".join(lines)
  with open(os.path.join(args.out, "step_time.md"), "w") as f:
    f.write(table + "\n")
  print(table)


if __name__ == "__main__":
  main(_ARGS)
