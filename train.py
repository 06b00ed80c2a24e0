"""Train a classifier on an LRA task.

    python train.py --config configs/listops/simple.py:tiny --workdir runs/listops_simple_tiny
    python train.py --config configs/listops/transformer.py --config.seed=1 ...

Any config field can be overridden with ``--config.<field>=<value>``. Re-running
with the same workdir resumes from its newest checkpoint.
"""

import os

from absl import app, flags, logging
from ml_collections import config_flags

config_flags.DEFINE_config_file("config", None, "Path to a config file, e.g. "
                                "configs/listops/simple.py:tiny.", lock_config=True)
flags.DEFINE_string("workdir", None, "Output directory (checkpoints, metrics, results). "
                    "Default: runs/<task>_<attention>_seed<seed>.")
flags.DEFINE_bool("jax_distributed", False, "Call jax.distributed.initialize() first "
                  "(multi-host TPU VM pods).")
flags.mark_flags_as_required(["config"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  import jax  # pylint: disable=import-outside-toplevel
  from simpletron_jax import train_lib  # pylint: disable=import-outside-toplevel
  if flags.FLAGS.jax_distributed:
    jax.distributed.initialize()
  config = flags.FLAGS.config
  workdir = flags.FLAGS.workdir or os.path.join(
      "runs", f"{config.task}_{config.model.attention}_seed{config.seed}")
  print(f"devices: {jax.devices()}; workdir: {workdir}")
  results = train_lib.train_and_evaluate(config, workdir)
  print(f"test accuracy {results['test_accuracy']:.4f} (majority class "
        f"{results['test_majority_rate']:.4f}) at best-validation step "
        f"{results['best_step']}; {results['steps_per_sec']:.2f} steps/s; "
        f"results in {os.path.join(workdir, 'results.json')}")


if __name__ == "__main__":
  app.run(main)
