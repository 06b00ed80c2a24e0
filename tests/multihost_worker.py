"""One process of the two-process runs in test_multihost.py (a helper, not a test).

    python tests/multihost_worker.py --process_id=I --port=P --workdir=W --out=OUT.json \
        [--kill_at=STEP] [--seed=S] [--parallelism=jit]

Joins a two-process ``jax.distributed`` run on ``127.0.0.1:P`` with one CPU device,
trains :func:`worker_config` on the presence task of ``tests/conftest.py`` (rebuilt from
its seed, so every process holds the same data) and writes to ``OUT.json`` what the test
checks: the example indices this process loaded for each batch, every evaluation it
computed, the files it opened for writing, and its ``train_and_evaluate`` results. With
``--kill_at``, the process ends with ``os._exit(KILLED_EXIT_CODE)`` right after that
optimizer step and its checkpoint, without any clean-up, as a killed job would.
``--seed`` changes this process's config (the start-up check must refuse it);
``--parallelism`` sets ``config.parallelism`` (default "pmap").
"""

import argparse
import builtins
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

KILLED_EXIT_CODE = 17
TIMEOUT_S = 60


def worker_config():
  """A tiny presence-task config: 1 layer, global batch 8, 6 steps, dropout on, every
  split evaluated in one batch."""
  from configs.listops import simple as simple_config  # pylint: disable=import-outside-toplevel
  config = simple_config.get_config("tiny")
  config.model.update(emb_dim=16, qkv_dim=16, mlp_dim=32, num_heads=2, num_layers=1,
                      max_length=40)
  config.data.bucket = 0  # one batch shape: one compilation per step function
  config.update(batch_size=8, warmup=4, learning_rate=0.05, num_train_steps=6, log_every=2,
                eval_frequency=3, checkpoint_every=2, num_eval_steps=-1, eval_batch_size=200)
  return config


def presence_data():
  """The presence task of tests/conftest.py, rebuilt from its seed."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from simpletron_jax.data import tasks  # pylint: disable=import-outside-toplevel
  from tests.conftest import presence_examples  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  return tasks.TaskData(presence_examples(2000, rng), presence_examples(200, rng),
                        presence_examples(200, rng), vocab_size=16, num_classes=2,
                        source="synthetic")


def _record_loads(batches, data, loads):
  """Wraps batches.make_batch to append ``[split, indices]`` for every batch built."""
  names = {id(data.train): "train", id(data.val): "val", id(data.test): "test"}
  make_batch = batches.make_batch

  def recording(examples, indices, **kwargs):
    loads.append([names[id(examples)], [int(i) for i in indices]])
    return make_batch(examples, indices, **kwargs)

  batches.make_batch = recording


def _record_evals(evaluation, evals):
  """Wraps evaluation.evaluate to append every metrics dict it returns."""
  evaluate = evaluation.evaluate

  def recording(*args, **kwargs):
    metrics = evaluate(*args, **kwargs)
    evals.append(metrics)
    return metrics

  evaluation.evaluate = recording


def _record_writes(workdir, writes):
  """Wraps builtins.open to append every path under ``workdir`` opened to write."""
  root, open_ = os.path.abspath(workdir), builtins.open

  def recording(file, mode="r", *args, **kwargs):
    path = os.path.abspath(os.fspath(file)) if isinstance(file, (str, os.PathLike)) else ""
    if path.startswith(root) and set(mode) & set("wax"):
      writes.append(os.path.relpath(path, root))
    return open_(file, mode, *args, **kwargs)

  builtins.open = recording


def parse_args(argv):
  """The command line of the module docstring."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--process_id", type=int, required=True)
  parser.add_argument("--num_processes", type=int, default=2)
  parser.add_argument("--port", type=int, required=True)
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--out", required=True)
  parser.add_argument("--kill_at", type=int, default=None)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--parallelism", default="pmap")
  return parser.parse_args(argv)


def main(argv):
  args = parse_args(argv)
  xla_flags = os.environ.get("XLA_FLAGS", "")
  data = presence_data()
  os.environ["XLA_FLAGS"] = xla_flags  # importing conftest added its 2 devices
  from simpletron_jax.data import batches  # pylint: disable=import-outside-toplevel
  from simpletron_jax.runtime import distributed  # pylint: disable=import-outside-toplevel
  from simpletron_jax.train import evaluation, trainer  # pylint: disable=import-outside-toplevel
  distributed.initialize(f"127.0.0.1:{args.port}", args.num_processes, args.process_id,
                         timeout_s=TIMEOUT_S)
  import jax  # pylint: disable=import-outside-toplevel
  record = {"process_index": jax.process_index(), "process_count": jax.process_count(),
            "local_device_count": jax.local_device_count(), "loads": [], "evals": [],
            "writes": []}
  _record_loads(batches, data, record["loads"])
  _record_evals(evaluation, record["evals"])
  _record_writes(args.workdir, record["writes"])

  def dump():
    with open(args.out, "w") as f:
      json.dump(record, f)

  def hook(step):
    if step == args.kill_at:
      dump()
      os._exit(KILLED_EXIT_CODE)  # pylint: disable=protected-access

  config = worker_config()
  config.seed = args.seed
  config.parallelism = args.parallelism
  record["results"] = trainer.train_and_evaluate(config, args.workdir, step_hook=hook,
                                                 data=data)
  dump()


if __name__ == "__main__":
  main(sys.argv[1:])
