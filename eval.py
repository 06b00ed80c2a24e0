"""Evaluate a workdir's checkpoint on one split.

    python eval.py --workdir runs/listops_simple_seed0 --split test
    python eval.py --workdir ... --which latest --split val

Uses the config saved with the run (``workdir/config.json``) unless ``--config``
is given. Prints the accuracy and writes ``workdir/eval_<which>_<split>.json``.
"""

import json
import os

from absl import app, flags, logging
from ml_collections import config_flags

from simpletron_jax import xla_cache

config_flags.DEFINE_config_file("config", None, "Config file; default: the run's config.json.")
flags.DEFINE_string("workdir", None, "The run directory.", required=True)
flags.DEFINE_enum("split", "test", ["train", "val", "test"], "Split to evaluate.")
flags.DEFINE_enum("which", "best", ["best", "latest"], "best-validation or newest checkpoint.")
flags.DEFINE_integer("step", None, "A specific checkpoint step (overrides --which).")
flags.DEFINE_string("xla_cache_dir", None, xla_cache.FLAG_HELP)
flags.DEFINE_integer("precompile_workers", 0,
                     "Compile the eval step of every batch shape the split meets (one per "
                     "length bucket) first, in this many threads side by side; 0: each shape "
                     "compiles when it is first met.")


def main(argv):
  """absl entry point: scores one checkpoint of ``--workdir`` on ``--split`` and writes
  ``eval_<which or step>_<split>.json`` there (accuracy, loss, count, step).

  Raises:
    app.UsageError: for positional arguments.
    SystemExit: with the cause, for a missing or unreadable checkpoint or config
      (:class:`run_guard.RunError`).
  """
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)
  xla_cache.enable(flags.FLAGS.xla_cache_dir)
  from simpletron_jax import run_guard, train_lib  # pylint: disable=import-outside-toplevel
  flag_values = flags.FLAGS
  try:
    result = train_lib.evaluate_checkpoint(flag_values.workdir, split=flag_values.split,
                                          which=flag_values.which, step=flag_values.step,
                                          config=flag_values.config,
                                          precompile_workers=flag_values.precompile_workers)
  except run_guard.RunError as e:  # a named cause: the message, no traceback, exit 1
    raise SystemExit(f"eval.py: {type(e).__name__}: {e}") from None
  out = os.path.join(flag_values.workdir,
                     f"eval_{flag_values.which if flag_values.step is None else flag_values.step}"
                     f"_{flag_values.split}.json")
  with open(out, "w") as f:
    json.dump(run_guard.json_safe(result), f, indent=2, allow_nan=False)
  print(f"{flag_values.split} accuracy {result['accuracy']:.4f} on {int(result['count'])} "
        f"examples (checkpoint step {result['step']}); written to {out}")


if __name__ == "__main__":
  app.run(main)
