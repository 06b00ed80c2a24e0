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


_SINGLE_RUN = {}


def single_process_run(folder):
  """The workers' run in this process on its two devices, recorded as a worker records it:
  ``(workdir, {"loads", "evals", "results"})``; trained in ``folder`` (which must outlive the
  caller) the first time only. The test modules that compare two processes against it
  (test_multihost.py, test_faults_lifecycle.py) share it when they run in one process."""
  if "run" not in _SINGLE_RUN:
    import jax  # pylint: disable=import-outside-toplevel
    import pytest  # pylint: disable=import-outside-toplevel
    from simpletron_jax.data import batches  # pylint: disable=import-outside-toplevel
    from simpletron_jax.train import evaluation, trainer  # pylint: disable=import-outside-toplevel
    assert jax.process_count() == 1 and jax.local_device_count() == 2
    workdir, data = os.path.join(folder, "run"), presence_data()
    record = {"loads": [], "evals": []}
    with pytest.MonkeyPatch.context() as mp:
      mp.setattr(batches, "make_batch", batches.make_batch)  # restored on exit
      mp.setattr(evaluation, "evaluate", evaluation.evaluate)
      _record_loads(batches, data, record["loads"])
      _record_evals(evaluation, record["evals"])
      record["results"] = trainer.train_and_evaluate(worker_config(), workdir, data=data)
    _SINGLE_RUN["run"] = workdir, record
  return _SINGLE_RUN["run"]


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


def _cache_programs_from_this_process():
  """Lets this process (not process 0) write its programs to the persistent compilation cache.

  JAX writes the cache from process 0 only, and each process's programs have keys of their
  own (they name its device), so process 1 compiled every program of every pair of runs
  while process 0 read them back. Writing them here, the next pair reads the same
  executables instead of compiling them again (many seconds per pair). Under a JAX whose
  private writer has another signature, nothing changes.
  """
  import inspect  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  from jax._src import compilation_cache, compiler  # pylint: disable=import-outside-toplevel
  write = getattr(compiler, "_cache_write", None)
  expected = ["cache_key", "compile_time_secs", "module_name", "backend", "executable",
              "host_callbacks"]
  if jax.process_index() == 0 or write is None or \
      list(inspect.signature(write).parameters) != expected:
    return

  def write_here(cache_key, compile_time_secs, module_name, backend, executable,
                 host_callbacks):
    # What JAX's writer does on process 0: no programs with host callbacks, none compiled
    # faster than the configured minimum; a failed write only costs the next run a compile.
    minimum = jax.config.jax_persistent_cache_min_compile_time_secs
    if host_callbacks or compile_time_secs < minimum:
      return
    try:
      compilation_cache.put_executable_and_time(cache_key, module_name, executable, backend,
                                                int(compile_time_secs))
    except Exception:  # pylint: disable=broad-except
      pass

  compiler._cache_write = write_here  # pylint: disable=protected-access


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
  _cache_programs_from_this_process()
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
