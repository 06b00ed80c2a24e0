"""Evaluate a workdir's checkpoint on one split.

    python eval.py --workdir runs/listops_simple_seed0 --split test
    python eval.py --workdir ... --which latest --split val

Uses the config saved with the run (``workdir/config.json``) unless ``--config``
is given. Prints the accuracy and writes ``workdir/eval_<which>_<split>.json``.

A user error (a workdir that does not exist, which is never created; a missing checkpoint or
config; a bad flag) ends with one line, ``eval.py: <cause>``, and exit status 1;
``--verbose`` shows the traceback instead.
"""

import os

from absl import app, flags, logging
from ml_collections import config_flags

from simpletron_jax.runtime import cli, platforms, xla_cache

ROOT = os.path.dirname(os.path.abspath(__file__))

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
flags.DEFINE_bool("verbose", False, "Show the traceback of every error, user errors included.")


def main(argv):
  """absl entry point: scores one checkpoint of ``--workdir`` on ``--split`` and writes
  ``eval_<which or step>_<split>.json`` there (accuracy, loss, count, step).

  Raises:
    app.UsageError: for positional arguments.
    SystemExit: with the cause on one line, for a user error (a missing workdir, checkpoint
      or config; a bad config; :func:`simpletron_jax.runtime.cli.user_errors_exit`).
  """
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  with cli.user_errors_exit("eval.py", flags.FLAGS.verbose, dirs=(ROOT,)):
    _evaluate(flags.FLAGS)


def _evaluate(flag_values):
  """Evaluates and writes the result; user errors propagate to :func:`main`'s boundary."""
  logging.set_verbosity(logging.WARNING)
  cli.check_path_name(flag_values.workdir, "--workdir")   # printed and written below
  platforms.skip_absent_tpu()   # no libtpu start-up errors on a machine without a TPU
  xla_cache.enable(flags.FLAGS.xla_cache_dir)
  from simpletron_jax.runtime import atomic_io  # pylint: disable=import-outside-toplevel
  from simpletron_jax.train import final_test  # pylint: disable=import-outside-toplevel
  result = final_test.evaluate_checkpoint(flag_values.workdir, split=flag_values.split,
                                       which=flag_values.which, step=flag_values.step,
                                       config=flag_values.config,
                                       precompile_workers=flag_values.precompile_workers)
  out = os.path.join(flag_values.workdir,
                     f"eval_{flag_values.which if flag_values.step is None else flag_values.step}"
                     f"_{flag_values.split}.json")
  atomic_io.write_json_atomic(out, result)
  print(f"{flag_values.split} accuracy {result['accuracy']:.4f} on {int(result['count'])} "
        f"examples (checkpoint step {result['step']}); written to {out}")


def parse_flags(argv):
  """absl's flag parsing with one-line errors (:func:`simpletron_jax.runtime.cli.parse_flags`).

  Raises:
    SystemExit: status 1 and one line for ``--config.<field>`` overrides without ``--config``
      (the run's saved config.json takes none), and for the errors of ``cli.parse_flags``.
  """
  given = [a.split("=", 1)[0] for a in argv[1:] if a.startswith("--config.")]
  if given and not any(a == "--config" or a.startswith("--config=") for a in argv[1:]):
    raise SystemExit(f"eval.py: {given[0]} needs --config: overrides apply to a config file "
                     "(--config configs/<task>/<model>.py[:variant]); without --config eval.py "
                     "uses the run's config.json as saved, which takes no overrides")
  return cli.parse_flags(argv, "eval.py")


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
