"""Time per checkpoint save, synchronous vs asynchronous orbax saves, in one process.

    python benchmarks/checkpoint_save.py --saves 10 --out benchmarks/results/cpu

Builds the train state of ``--config`` (default: ListOps's paper config,
``configs/listops/simple.py``, no variant) the way ``trainer.train_and_evaluate`` does
(``train_state.build_model`` sized to the task's vocabulary and class count, from the task's
token module, without loading data; ``train_state.create_train_state``: parameters and AdamW
moments, the moments filled with random values as after training, see
:func:`trained_moments`), then saves it ``--saves`` times each way with
:func:`checkpoints.save_checkpoint`, into one manager per way in a temporary folder, with the
config's ``max_to_keep`` (so the removal of old steps is part of each save). The two ways
alternate save by save, so a slow spell of a shared machine hits both alike. For each save
it records:

* ``blocked_s``: how long ``save_checkpoint`` held the caller (the training loop): for a
  synchronous save the checks (NaN/inf, CRC-32) and the whole write; for an asynchronous one
  the checks, the host copies and the start of the write;
* ``durable_s``: until the step is written and renamed into place, i.e. until
  :func:`checkpoints.finish_saves` returns (which the benchmark calls right after each save,
  so each save starts with no write in flight; in training the next save comes
  ``checkpoint_every`` steps later).

One save per way comes first, outside the statistics (orbax's first-use costs); it is
reported as ``first_save``. Last, the parts of the blocked time that come before orbax's save
are timed apart (:func:`blocked_parts`). Writes ``checkpoint_save.json`` and
``checkpoint_save.md`` to ``--out``.
"""

import argparse
import copy
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from simpletron_jax.runtime import cli  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
  """The command line (see the module docstring)."""
  parser = cli.ArgumentParser(prog="checkpoint_save.py",
                              description=__doc__.split("\n", maxsplit=1)[0])
  parser.add_argument("--config", default="configs/listops/simple.py",
                      help="path.py[:variant][,field=value...] (as benchmarks/step_time.py)")
  parser.add_argument("--saves", type=int, default=10, help="timed saves per way")
  parser.add_argument("--dir", default=None, help="where the temporary folder goes "
                      "(default: the system's; the disk is part of what is measured)")
  parser.add_argument("--out", default=os.path.join(ROOT, "runs", "benchmarks", "cpu"),
                      help="output folder (default runs/benchmarks/cpu; the committed tables: "
                      "--out benchmarks/results/cpu)")
  args = parser.parse_args(argv)
  if args.saves < 1:
    parser.error("--saves must be >= 1")
  return args


if __name__ == "__main__":
  # The flags first: --help and a bad invocation end here, before the imports below load JAX.
  _ARGS = parse_args()

import jax  # noqa: E402
import numpy as np  # noqa: E402

from simpletron_jax.train import checkpoints, run_config, train_state  # noqa: E402
from simpletron_jax.run import run_guard
from step_time import load_config  # noqa: E402  (benchmarks/step_time.py)

# The vocabulary size and class count of each task, as tasks.load_task reports them.
TASK_SIZES = {"listops": "simpletron_jax.data.listops", "text": "simpletron_jax.data.text",
              "retrieval": "simpletron_jax.data.retrieval", "image": "simpletron_jax.data.image",
              "pathfinder": "simpletron_jax.data.pathfinder.params",
              "pathx": "simpletron_jax.data.pathfinder.params"}
MODES = ("sync", "async")


def task_sizes(task: str) -> tuple[int, int]:
  """``(vocab_size, num_classes)`` of ``task`` (``config.task``) from its data module.

  Raises:
    ValueError: a task without a fixed vocabulary here.
  """
  if task not in TASK_SIZES:
    raise ValueError(f"config.task={task!r}: no vocabulary size known; one of "
                     f"{list(TASK_SIZES)}")
  module = importlib.import_module(TASK_SIZES[task])
  return int(module.VOCAB_SIZE), int(module.NUM_CLASSES)


def trained_moments(state, seed: int = 0):
  """``state`` with every float optimizer array of more than one element (AdamW's moments)
  filled with random values, on the device like the originals.

  At step 0 the moments are zeros, which orbax's compressed format stores in a fraction of
  their size; after training they are as incompressible as random numbers, and that is
  what a training run saves.
  """
  rng = np.random.default_rng(seed)

  def fill(x):
    if not (np.issubdtype(x.dtype, np.floating) and x.size > 1):
      return x
    return jax.device_put(np.abs(rng.standard_normal(x.shape)).astype(x.dtype) * 1e-3)

  return state.replace(opt_state=jax.tree_util.tree_map(fill, state.opt_state))


def folder_bytes(path: str) -> int:
  """Total size in bytes of the files under ``path``."""
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def timed_save(manager, step: int, state, meta: dict) -> tuple[float, float]:
  """Saves ``state`` at ``step``; returns ``(blocked_s, durable_s)`` (seconds, wall clock)."""
  start = time.perf_counter()
  checkpoints.save_checkpoint(manager, step, state, meta)
  blocked = time.perf_counter() - start
  checkpoints.finish_saves(manager)
  return blocked, time.perf_counter() - start


def blocked_parts(state, repeats: int = 3) -> dict[str, float]:
  """Seconds (min of ``repeats``) of the work ``save_checkpoint`` does before orbax starts:
  the copy to the host, the private copy of an asynchronous save, orbax's own copy of numpy
  arrays (``NumpyHandler``'s ``deepcopy``), the NaN/inf check and the CRC-32."""
  tree = checkpoints._ckpt_tree(state)  # pylint: disable=protected-access
  arrays = (tree["params"], tree["opt_state"])
  work = {
      "device_get": lambda: checkpoints._ckpt_tree(state),  # pylint: disable=protected-access
      "private_copy": lambda: jax.tree_util.tree_map(lambda x: np.array(x, copy=True), tree),
      "orbax_copy": lambda: [copy.deepcopy(x) for x in jax.tree_util.tree_leaves(tree)],
      "finite_check": lambda: run_guard.tree_is_finite(tree),
      "crc32": lambda: run_guard.state_crc32(arrays),
  }
  parts = {}
  for name, fn in work.items():
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      fn()
      times.append(time.perf_counter() - start)
    parts[name] = min(times)
  return parts


def summary(values: list[float]) -> dict[str, float]:
  """Median, min and max of ``values`` (seconds)."""
  return {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values)}


def main(args: argparse.Namespace | None = None):
  """Command line: see the module docstring. ``args``: the flags already parsed
  (:func:`parse_args`; default: parsed from ``sys.argv``)."""
  args = parse_args() if args is None else args

  config = load_config(args.config)
  vocab_size, num_classes = task_sizes(config.task)
  run = run_config.RunConfig.from_config_dict(config)
  model = train_state.build_model(run, types.SimpleNamespace(
      vocab_size=vocab_size, num_classes=num_classes, train=None))
  state = trained_moments(train_state.create_train_state(
      run.train, model, jax.random.PRNGKey(0), config.model.max_length))
  params = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
  state_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves((state.params, state.opt_state)))
  meta = {"run_id": "benchmark", "best_val_accuracy": 0.5, "best_step": 1,
          "train_seconds": 1.0, "model_config": checkpoints.model_config_dict(config.model)}
  print(f"{args.config}: {params:,} parameters, {state_bytes / 2**20:.1f} MiB of parameters "
        f"and optimizer state", file=sys.stderr)

  load_before = os.getloadavg()
  base = tempfile.mkdtemp(prefix="checkpoint_save_", dir=args.dir)
  try:
    managers = {mode: checkpoints.checkpoint_manager(os.path.join(base, mode),
                                                     config.max_to_keep,
                                                     async_save=mode == "async")
                for mode in MODES}
    first = {mode: dict(zip(("blocked_s", "durable_s"),
                            timed_save(managers[mode], 1, state.replace(step=1), meta)))
             for mode in MODES}
    checkpoint_bytes = folder_bytes(os.path.join(base, "sync", "1"))
    times = {mode: {"blocked_s": [], "durable_s": []} for mode in MODES}
    for i in range(args.saves):
      step = 2 + i
      for mode in (MODES if i % 2 == 0 else MODES[::-1]):
        blocked, durable = timed_save(managers[mode], step, state.replace(step=step), meta)
        times[mode]["blocked_s"].append(blocked)
        times[mode]["durable_s"].append(durable)
      print(f"save {i + 1}/{args.saves}: " + ", ".join(
          f"{m} blocked {times[m]['blocked_s'][-1]:.3f} s durable {times[m]['durable_s'][-1]:.3f} s"
          for m in MODES), file=sys.stderr)
    kept = {mode: sorted(managers[mode].all_steps()) for mode in MODES}
  finally:
    shutil.rmtree(base, ignore_errors=True)
  parts = blocked_parts(state)
  load_after = os.getloadavg()

  device = jax.devices()[0]
  rows = {mode: {"blocked": summary(times[mode]["blocked_s"]),
                 "durable": summary(times[mode]["durable_s"]),
                 "first_save": first[mode], "all": times[mode], "steps_kept": kept[mode]}
          for mode in MODES}
  record = {
      "command": shlex.join(["python", "benchmarks/checkpoint_save.py", *sys.argv[1:]]),
      "date": datetime.date.today().isoformat(),
      "config": args.config, "task": config.task, "attention": config.model.attention,
      "vocab_size": vocab_size, "num_classes": num_classes,
      "parameters": int(params), "state_bytes_in_memory": int(state_bytes),
      "bytes_per_checkpoint": int(checkpoint_bytes), "max_to_keep": config.max_to_keep,
      "saves_per_way": args.saves,
      "machine": {"platform": platform.platform(), "processor": platform.processor(),
                  "cpu_count": os.cpu_count(), "device": f"{device.platform}:{device.device_kind}",
                  "loadavg_before": load_before, "loadavg_after": load_after,
                  "folder": os.path.dirname(base)},
      "versions": {"python": platform.python_version(), "jax": jax.__version__,
                   "orbax-checkpoint": importlib.metadata.version("orbax-checkpoint"),
                   "flax": importlib.metadata.version("flax")},
      "rows": rows,
      "blocked_parts_min_s": parts,
  }
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "checkpoint_save.json"), "w") as f:
    json.dump(record, f, indent=2)

  lines = [
      f"Checkpoint save time, {args.config} ({config.task}, {config.model.attention}): "
      f"{params:,} parameters; {state_bytes / 2**20:.1f} MiB of parameters and AdamW state "
      f"in memory, {checkpoint_bytes / 2**20:.1f} MiB per checkpoint on disk. "
      f"{args.saves} saves each way, alternating, after one first save kept apart; "
      f"{record['machine']['device']}, {os.cpu_count()} CPUs (load average "
      f"{load_before[0]:.1f} before, {load_after[0]:.1f} after), orbax-checkpoint "
      f"{record['versions']['orbax-checkpoint']}, jax {jax.__version__}.", "",
      "| saves | loop blocked per save, median (min) | until durable, median (min) | "
      "first save blocked / durable |",
      "|---|---|---|---|"]
  for mode in MODES:
    r = rows[mode]
    lines.append(f"| {mode} | {r['blocked']['median_s']:.3f} s ({r['blocked']['min_s']:.3f} s) "
                 f"| {r['durable']['median_s']:.3f} s ({r['durable']['min_s']:.3f} s) "
                 f"| {r['first_save']['blocked_s']:.3f} s / {r['first_save']['durable_s']:.3f} s |")
  lines += ["", "Blocked: the time `save_checkpoint` holds the training loop. Durable: until the "
            "step's folder is written and renamed into place (`finish_saves` returned).", "",
            "Work before orbax starts, min of 3: " + ", ".join(
                f"{name} {seconds:.3f} s" for name, seconds in parts.items())
            + " (private_copy and orbax_copy: asynchronous saves only).", "",
            f"Command: `{record['command']}`"]
  table = "\n".join(lines)
  with open(os.path.join(args.out, "checkpoint_save.md"), "w") as f:
    f.write(table + "\n")
  print(table)


if __name__ == "__main__":
  main(_ARGS)
