"""Train a classifier on an LRA task.

    python train.py --config configs/listops/simple.py:tiny --workdir runs/listops_simple_tiny
    python train.py --config configs/listops/transformer.py --config.seed=1 ...

Any config field can be overridden with ``--config.<field>=<value>``. Re-running
with the same workdir resumes from its newest checkpoint. ``--profile_steps=A:B`` writes a JAX
profiler trace of steps A..B to ``<workdir>/profile``; ``--config.wandb.project=NAME`` also logs
to Weights & Biases (docs/runs.md). On SIGTERM or SIGINT (a preemption,
Ctrl-C) the run finishes its step, saves it and exits with status 75
(``preemption.PREEMPTED_EXIT_CODE``); any other named cause exits 1.

Resuming, a setting that changes what is computed (data, optimizer and schedule, batch size,
device or host count; ``run_record.RESUME_ALLOWED_FIELDS`` lists those that may change) must be
the checkpoint's, unless ``--allow_resume_changes``. A user error (a bad config field or flag,
a missing file, a mismatched checkpoint) ends with one line, ``train.py: <cause>``, and exit
status 1; ``--verbose`` shows the traceback instead. A signal that the run could not wait for
(a second SIGINT, or one before the run's guard is installed, while the data load) ends with one
line and status 130, without saving; the last checkpoint stays. A SIGTERM outside the guard
(while the data are generated or loaded, during the final test, or a second one) stops the run
cleanly, generator workers and half-written files included, and one line says what is saved:
status 75 when a checkpoint is (during the final test: the last step), 143 when nothing is.
"""

import os
import signal
import sys

INTERRUPTED_LINE = ("train.py: interrupted (SIGINT) before the run could save; the last "
                    "checkpoint stays: rerun the same command to continue from it")


def _interrupted_while_starting(signum, frame):  # pylint: disable=unused-argument
  """A Ctrl-C while the libraries import and the flags are read: nothing is written yet, so
  the documented line and status 130, without a traceback; main's own handler replaces it."""
  sys.stderr.write(INTERRUPTED_LINE + "\n")
  sys.stderr.flush()
  os._exit(130)   # pylint: disable=protected-access


if __name__ == "__main__":
  signal.signal(signal.SIGINT, _interrupted_while_starting)

from absl import app, flags, logging  # noqa: E402  pylint: disable=wrong-import-position
from ml_collections import config_flags

from simpletron_jax.runtime import cli, errors, platforms, progress, xla_cache
from simpletron_jax.run import metric_logging, profiling
from simpletron_jax.run.run_folder import RunFolder

ROOT = os.path.dirname(os.path.abspath(__file__))
INTERRUPTED_EXIT_CODE = 130   # 128 + SIGINT, as a shell reports a process that SIGINT ended

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
flags.DEFINE_bool("allow_resume_changes", False,
                  "Resume even though settings that change what is computed (seed, data, "
                  "optimizer and schedule, batch size, device or host count) differ from the "
                  "checkpoint's; each change is recorded in config.json's config_history. "
                  "model.* changes stay refused.")
flags.DEFINE_bool("start_over", False,
                  "Train from step 0 in a workdir whose every checkpoint was found damaged "
                  "and moved to damaged/ (without it such a run stops with one line). "
                  "damaged/ and the run id are kept; metrics.jsonl starts again at step 0.")
flags.DEFINE_string("profile_steps", None,
                    "A:B: write a JAX profiler trace of optimizer steps A..B (both included, "
                    "1 <= A <= B <= num_train_steps) to <workdir>/profile, for TensorBoard's "
                    "profile plugin or ui.perfetto.dev (docs/runs.md, \"Profiling\"). A run "
                    "resumed at or past step A traces nothing.")
flags.DEFINE_bool("verbose", False, "Show the traceback of every error, user errors included.")
flags.mark_flags_as_required(["config"])


def main(argv):
  """absl entry point: trains and evaluates ``--config`` in ``--workdir``; the files it
  writes are listed in docs/runs.md ("What a run writes").

  Raises:
    app.UsageError: for positional arguments (:func:`parse_flags` refuses them first).
    SystemExit: status 1 with one line for a user error; 75 after a preemption (saved);
      130 with one line for an interrupt the run did not wait for (nothing saved).
  """
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  signal.signal(signal.SIGINT, signal.default_int_handler)   # the start-up handler's end
  try:
    with cli.sigterm_raises(), cli.sigint_raises(), cli.user_errors_exit(
        "train.py", flags.FLAGS.verbose, dirs=(ROOT,)):
      _train(flags.FLAGS)
    return
  except errors.Terminated as e:   # SIGTERM outside the run's guard: the data phase, the final test
    if flags.FLAGS.verbose:
      raise
    line, status = _after_sigterm(_RUN.get("workdir"), _RUN.get("num_train_steps"))
    line, stopped = f"train.py: {line}", e
  except KeyboardInterrupt as e:
    if flags.FLAGS.verbose:
      raise
    line, status, stopped = INTERRUPTED_LINE, INTERRUPTED_EXIT_CODE, e
  # The signal may have stopped a library halfway (an orbax save's event loop or coroutine
  # not yet run): what it left is finalized here, quietly, before the last line.
  cli.release_interrupted(stopped)
  print(line, file=sys.stderr)
  raise SystemExit(status)


_RUN = {}   # the workdir and step count of this process's run, for main's SIGTERM line
TERMINATED_EXIT_CODE = 143   # 128 + SIGTERM: nothing was saved


def _after_sigterm(workdir: str | None, num_train_steps: int | None) -> tuple[str, int]:
  """The line and exit status after a SIGTERM that the run's guard did not handle (one while
  the data were prepared, during the final test, or a second one): what the workdir keeps.

  Returns:
    ``(message, status)``: status 75 (``preemption.PREEMPTED_EXIT_CODE``) when a checkpoint
    is saved and a rerun continues from it, :data:`TERMINATED_EXIT_CODE` when nothing is.
  """
  folder = RunFolder(workdir) if workdir else None
  step = folder.newest_step() if folder else None
  if step is None:
    return ("SIGTERM before the run's first checkpoint: nothing was saved, and no half-written "
            "file is left (the data cache keeps complete files only, and generator workers "
            "were stopped); rerun the same command to start again", TERMINATED_EXIT_CODE)
  where = folder.checkpoints_dir
  preempted = 75   # preemption.PREEMPTED_EXIT_CODE, without importing JAX here
  if num_train_steps is not None and step >= num_train_steps and not os.path.exists(
      folder.results_path):
    return (f"SIGTERM during the final test: the trained run is saved (step {step} in "
            f"{where}), and no results.json is written yet; rerun the same command to test "
            "it", preempted)
  return (f"SIGTERM before the run could save again: its last checkpoint, step {step} in "
          f"{where}, stays; rerun the same command to continue from it", preempted)


def _train(fl):
  """Trains and evaluates; user errors propagate to :func:`main`'s boundary."""
  # Flags and config.wandb are checked before JAX starts, so a typo costs no start-up.
  profile_steps = profiling.parse_profile_steps(fl.profile_steps, fl.config.num_train_steps)
  progress.env_interval()   # a malformed SIMPLETRON_PROGRESS_SECONDS, before anything is written
  wandb = metric_logging.WandbConfig.from_config(fl.config)
  wandb.validate()
  wandb.enabled()
  config = fl.config
  workdir = fl.workdir or os.path.join(
      "runs", f"{config.task}_{config.model.attention}_seed{config.seed}")
  cli.check_workdir(workdir, "--workdir")   # before it is printed or written anywhere
  _RUN.update(workdir=workdir, num_train_steps=config.num_train_steps)
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  platforms.skip_absent_tpu()   # no libtpu start-up errors on a machine without a TPU
  import jax  # pylint: disable=import-outside-toplevel
  from simpletron_jax.runtime import distributed  # pylint: disable=import-outside-toplevel
  from simpletron_jax.train import trainer  # pylint: disable=import-outside-toplevel
  from simpletron_jax.run import preemption
  from simpletron_jax.tools import reporting  # pylint: disable=import-outside-toplevel
  xla_cache.enable(fl.xla_cache_dir)
  if fl.jax_distributed or fl.coordinator_address:
    distributed.initialize(fl.coordinator_address, fl.num_processes, fl.process_id,
                           timeout_s=fl.distributed_timeout)
  print(f"devices: {platforms.devices()}; workdir: {workdir}")   # a bad JAX_PLATFORMS: one line
  if profile_steps:
    profiling.check_profiler_can_run()   # before the data and the model, not at step A
  fresh = not os.path.lexists(workdir)   # created by this start (a failed one removes it)
  try:
    results = trainer.train_and_evaluate(config, workdir,
                                         precompile_workers=fl.precompile_workers,
                                         allow_resume_changes=fl.allow_resume_changes,
                                         profile_steps=profile_steps,
                                         start_over=fl.start_over)
  except preemption.PreemptedError as e:  # SIGTERM/SIGINT: saved; exit 75 (EX_TEMPFAIL)
    print(f"train.py: {e}", file=sys.stderr)
    raise SystemExit(preemption.PREEMPTED_EXIT_CODE) from None
  except errors.StartError as e:   # W&B did not start: no step was trained
    if fresh and RunFolder(workdir).remove_if_unstarted():
      raise type(e)(f"{e}; nothing was trained, and {workdir}, which this start had created, "
                    "was removed") from e
    raise
  # Any other RunError, and ValueErrors and OSErrors of our own checks, are printed on one
  # line by main's cli.user_errors_exit (exit 1).
  print(f"test accuracy {reporting.protocol_accuracy(results, 'best_val'):.4f} (majority class "
        f"{results['test_majority_rate']:.4f}) at best-validation step "
        f"{results['best_step']}, {results['test_accuracy_final']:.4f} at the final step "
        f"{results['final_step']}; {results['steps_per_sec']:.2f} steps/s; "
        f"results in {RunFolder(workdir).results_path}")


def parse_flags(argv):
  """absl's flag parsing; a bad ``--config`` (a missing file, an unknown ``:variant``, a
  ``--config.<field>`` the config lacks) or flag value exits with status 1 and one line
  (:func:`simpletron_jax.runtime.cli.parse_flags`)."""
  return cli.parse_flags(argv, "train.py")


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
