"""Train a classifier on an LRA task.

    python train.py --config configs/listops/simple.py:tiny --workdir runs/listops_simple_tiny
    python train.py --config configs/listops/transformer.py --config.seed=1 ...

Any config field can be overridden with ``--config.<field>=<value>``. Re-running
with the same workdir resumes from its newest checkpoint.
"""

import os
import re

from absl import app, flags, logging
from ml_collections import config_flags

from simpletron_jax import xla_cache

config_flags.DEFINE_config_file("config", None, "Path to a config file, e.g. "
                                "configs/listops/simple.py:tiny.", lock_config=True)
flags.DEFINE_string("workdir", None, "Output directory (checkpoints, metrics, results). "
                    "Default: runs/<task>_<attention>_seed<seed>.")
flags.DEFINE_bool("jax_distributed", False, "Join a multi-host run first "
                  "(jax.distributed.initialize): TPU VM pods, several GPU hosts. Without the "
                  "three flags below, JAX finds the cluster itself (Cloud TPU, SLURM, Open "
                  "MPI).")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0, the same on every "
                    "host (implies --jax_distributed); default: $JAX_COORDINATOR_ADDRESS.")
flags.DEFINE_integer("num_processes", None, "Processes (hosts) in the run.")
flags.DEFINE_integer("process_id", None, "This process's index, 0 on the coordinator.")
flags.DEFINE_float("distributed_timeout", 300.0, "Seconds to wait for the coordinator and "
                   "for every process to join.")
flags.DEFINE_string("xla_cache_dir", None, xla_cache.FLAG_HELP)
flags.DEFINE_integer("precompile_workers", 0,
                     "Compile the train and eval steps of every batch shape the run will meet "
                     "(one per length bucket) before training, in this many threads side by "
                     "side; 0: compile each shape when the loop first meets it. Meant for "
                     "data.group_by_length runs, which meet many buckets (13 in an epoch of "
                     "paper ListOps).")
flags.mark_flags_as_required(["config"])


def main(argv):
  """absl entry point: trains and evaluates ``--config`` in ``--workdir``; the files it
  writes are listed in the README ("What a run writes").

  Raises:
    app.UsageError: for positional arguments.
  """
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  import jax  # pylint: disable=import-outside-toplevel
  from simpletron_jax import train_lib  # pylint: disable=import-outside-toplevel
  from simpletron_jax import distributed  # pylint: disable=import-outside-toplevel
  fl = flags.FLAGS
  xla_cache.enable(fl.xla_cache_dir)
  if fl.jax_distributed or fl.coordinator_address:
    distributed.initialize(fl.coordinator_address, fl.num_processes, fl.process_id,
                           timeout_s=fl.distributed_timeout)
  config = flags.FLAGS.config
  workdir = flags.FLAGS.workdir or os.path.join(
      "runs", f"{config.task}_{config.model.attention}_seed{config.seed}")
  print(f"devices: {jax.devices()}; workdir: {workdir}")
  from simpletron_jax import run_guard  # pylint: disable=import-outside-toplevel
  try:
    results = train_lib.train_and_evaluate(config, workdir,
                                           precompile_workers=fl.precompile_workers)
  except run_guard.RunError as e:  # a named cause: the message, no traceback, exit 1
    raise SystemExit(f"train.py: {type(e).__name__}: {e}") from None
  print(f"test accuracy {results['test_accuracy']:.4f} (majority class "
        f"{results['test_majority_rate']:.4f}) at best-validation step "
        f"{results['best_step']}, {results['test_accuracy_final']:.4f} at the final step "
        f"{results['final_step']}; {results['steps_per_sec']:.2f} steps/s; "
        f"results in {os.path.join(workdir, 'results.json')}")


def parse_flags(argv):
  """absl's flag parsing, except that a ``--config.<field>`` override of a field the config
  lacks exits with status 1 naming the overrides, instead of ml_collections' traceback."""
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError) as e:
    given = [a.split("=")[0] for a in argv[1:] if a.startswith("--config.")]
    field = re.search(r"'(\w+)", str(e))
    hint = re.search(r'Did you mean "(\w+)"', str(e))
    raise SystemExit(
        f"train.py: the config has no field {field.group(1) if field else e!r}"
        f"{f' (did you mean {hint.group(1)!r}?)' if hint else ''}; overrides: "
        f"{', '.join(given)}. The options "
        "of a variant are listed under model.attention_kwargs in its config, e.g. python -c "
        "\"from configs.listops import simple; print(simple.get_config('tiny').model)\"") from None


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
