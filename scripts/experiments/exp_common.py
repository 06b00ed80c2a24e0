"""Shared pieces of the papers' experiments (``scripts/experiments/*.py``): command-line
options, configs, training through ``trainer``, evaluating a parameter tree, and the
JSON / markdown / PNG outputs.

Every script has a CPU ``--quick`` mode (``:tiny`` configs) and a paper-size mode;
``--steps`` / ``--eval_every`` set the step counts, ``--config.<field>=<value>`` any field of
every run (train.py's syntax, :mod:`simpletron_jax.runtime.overrides`). Runs go to ``--runs``
(default ``runs/experiments/<name>/``), the JSON, markdown table and PNG to ``--out`` (default:
``--runs``) and, with ``--copy_to DIR``, into ``DIR`` too (e.g. ``results/experiments/<name>/``).

Flags use underscores; the dashed spellings of an earlier release (``--eval-every``,
``--copy-to``, ``--lora-rank``, ``--finetune-steps``, ``--finished-only``) are accepted with a
note until the next (:class:`simpletron_jax.runtime.cli.ArgumentParser`). A bad invocation or a
user error (an unknown or bad config field, missing data, a runs folder of another config) ends
with one line, ``<script>: <cause>``, and exit status 1; ``--verbose`` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
from typing import TYPE_CHECKING, Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import ml_collections  # noqa: E402  pylint: disable=wrong-import-position

from simpletron_jax.runtime import cli, overrides  # noqa: E402  pylint: disable=C0413
from simpletron_jax.run import run_record  # noqa: E402  pylint: disable=C0413
from simpletron_jax.run.metric_logging import read_records  # noqa: E402  pylint: disable=C0413

if TYPE_CHECKING:
  from simpletron_jax.data import tasks

# The modules below import JAX: each function imports what it needs when it runs, so a
# script's --help and a bad invocation end before JAX loads. They are still attributes of this
# module (exp_common.trainer, exp_common.lra), imported on first read (:func:`__getattr__`).
_LAZY_MODULES = {"lra": "configs.lra", "evaluation": "simpletron_jax.train.evaluation",
                 "run_config": "simpletron_jax.train.run_config",
                 "steps": "simpletron_jax.train.steps",
                 "train_state": "simpletron_jax.train.train_state",
                 "trainer": "simpletron_jax.train.trainer",
                 "batches": "simpletron_jax.data.batches", "tasks": "simpletron_jax.data.tasks"}


def __getattr__(name: str) -> Any:
  """``exp_common.<name>`` for a module of :data:`_LAZY_MODULES`: imported now."""
  if name in _LAZY_MODULES:
    return importlib.import_module(_LAZY_MODULES[name])
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


OUTPUT_EXTENSIONS = ("json", "md", "png")


def add_common_args(parser: argparse.ArgumentParser, name: str) -> None:
  """Adds ``--quick``, ``--steps``, ``--eval_every``, ``--out``, ``--copy_to``, ``--runs``,
  ``--verbose`` (the ``--config.<field>=<value>`` overrides are taken by
  :class:`simpletron_jax.runtime.overrides.OverrideParser`)."""
  parser.add_argument("--quick", action="store_true",
                      help="CPU mode: the :tiny configs and few steps")
  parser.add_argument("--steps", type=int, default=None,
                      help="training steps of every run (default: the mode's)")
  parser.add_argument("--eval_every", type=int, default=None,
                      help="steps between validations (default: the mode's)")
  parser.add_argument("--out", default=None,
                      help="folder for the JSON, markdown table and PNG (default: --runs)")
  parser.add_argument("--copy_to", default=None, metavar="DIR",
                      help="also copy the JSON, markdown table and PNG here, e.g. "
                           f"results/experiments/{name} to refresh the committed ones")
  parser.add_argument("--runs", default=os.path.join("runs", "experiments", name),
                      help="folder for the training runs (checkpoints); a finished run "
                           "(with results.json) is reused")
  parser.add_argument("--verbose", action="store_true",
                      help="show the traceback of every error, user errors included")


def run_cli(main: Callable[..., Any], argv: list[str] | None = None) -> Any:
  """Returns ``main(argv)`` (default ``sys.argv[1:]``) run as a command: a user error (a
  ``ValueError`` or ``OSError`` of the project's or the scripts' code, an ``errors.RunError``)
  exits with status 1 and ``<script>: <cause>`` on one line; other errors, and every error with
  ``--verbose``, keep their traceback (:func:`simpletron_jax.runtime.cli.user_errors_exit`)."""
  argv = sys.argv[1:] if argv is None else argv
  program = os.path.basename(sys.argv[0]) or "script"
  with cli.user_errors_exit(program, "--verbose" in argv, dirs=(ROOT,)):
    return main(argv)


def make_parser(name: str, doc: str) -> argparse.ArgumentParser:
  """The parser of script ``name`` (a :class:`simpletron_jax.runtime.overrides.OverrideParser`): its
  docstring's first paragraph and the common options."""
  parser = overrides.OverrideParser(
      old_flags=("--override",), description=doc.split("\n\n")[0],
      epilog="--config.<field>=<value> (repeatable) sets a config field of every run, as for "
             "train.py, e.g. --config.model.max_length=256")
  add_common_args(parser, name)
  return parser


def out_dir(args) -> str:
  """Where a script writes its JSON, markdown and PNG: ``--out``, else the ``--runs`` folder."""
  return args.out or args.runs


def finish(args, name: str, result: dict, table_md: str, plot: Callable[[Any], None],
           **fields) -> dict:
  """Writes a script's outputs (:func:`write_outputs`) to :func:`out_dir` and ``--copy_to``,
  prints its table; returns the JSON payload: ``experiment``, ``quick``, ``config_overrides``
  (when any), ``fields`` and ``result``."""
  payload = {"experiment": name, "quick": args.quick, **fields, **result}
  if getattr(args, "config_overrides", None):
    payload["config_overrides"] = list(args.config_overrides)
  paths = write_outputs(out_dir(args), name, payload, table_md, plot)
  if getattr(args, "copy_to", None):
    os.makedirs(args.copy_to, exist_ok=True)
    for path in paths.values():
      shutil.copy(path, args.copy_to)
  print(table_md)
  return payload


def _set_field(config: ml_collections.ConfigDict, key: str, value: Any) -> None:
  """Sets the existing field ``key`` (dotted) of ``config`` to ``value``; raises ValueError
  for a missing field or section, or a value of another type."""
  *path, leaf = key.split(".")
  target = config
  for part in path:
    if not isinstance(target, ml_collections.ConfigDict) or part not in target:
      raise ValueError(f"config has no field {key!r}")
    target = target[part]
  if not isinstance(target, ml_collections.ConfigDict) or leaf not in target:
    raise ValueError(f"config has no field {key!r}")
  try:
    target[leaf] = value
  except TypeError as e:   # ml_collections refuses a value of another type
    raise ValueError(f"config field {key!r}: {e}") from None


def make_config(args, task: str, attention: str, steps: int | None = None,
                eval_every: int | None = None, **fields) -> ml_collections.ConfigDict:
  """``configs/lra.make_config(task, attention, 'tiny' if --quick)`` with the run length.

  ``steps``, ``eval_every``: the mode's defaults (None: the config's), replaced by ``--steps``
  / ``--eval_every``; ``fields``: further settings, dots written ``__`` (``model__num_layers``).
  Warmup is at most a fifth of the steps, checkpoints follow validation, and the
  ``--config.*`` overrides come last; ValueError, one line, for an override of a field the
  config lacks or of another type (:func:`simpletron_jax.runtime.overrides.apply_overrides`).
  """
  from configs import lra  # pylint: disable=import-outside-toplevel
  config = lra.make_config(task, attention, "tiny" if args.quick else None)
  steps = args.steps or steps or config.num_train_steps
  set_length(config, steps, args.eval_every or eval_every or config.eval_frequency)
  for key, value in fields.items():
    _set_field(config, key.replace("__", "."), value)
  return overrides.apply_overrides(config, getattr(args, "config_overrides", ()))


def set_length(config: ml_collections.ConfigDict, steps: int, eval_every: int) -> None:
  """Sets ``num_train_steps``; validation and checkpoints every ``eval_every`` steps (at
  most ``steps``); warmup at most a fifth of the steps."""
  config.num_train_steps = steps
  config.eval_frequency = min(eval_every, steps)
  config.checkpoint_every = config.eval_frequency
  config.log_every = min(config.log_every, config.eval_frequency)
  config.warmup = min(config.warmup, max(steps // 5, 1))


class DataCache:
  """Task data loaded once per (task, data settings), or one preloaded task for tests."""

  def __init__(self, data: tasks.TaskData | None = None):
    self._fixed = data
    self._cache: dict[str, tasks.TaskData] = {}

  def __call__(self, config: ml_collections.ConfigDict) -> tasks.TaskData:
    if self._fixed is not None:
      return self._fixed
    key = config.task + json.dumps(config.data.to_dict(), sort_keys=True, default=str)
    if key not in self._cache:
      from simpletron_jax.data import tasks  # pylint: disable=import-outside-toplevel
      self._cache[key] = tasks.load_task(tasks.data_config(config))
    return self._cache[key]


def finished(workdir: str, config: ml_collections.ConfigDict | None = None) -> bool:
  """Whether ``workdir/results.json`` is a finished run (of ``config`` when given):
  :func:`simpletron_jax.run.run_record.workdir_results_problem` finds nothing wrong with it."""
  return run_record.workdir_results_problem(workdir, config) is None


def train(config: ml_collections.ConfigDict, workdir: str, data: tasks.TaskData) -> dict:
  """Trains with ``trainer.train_and_evaluate``, or reads a finished run's results (one
  that :func:`simpletron_jax.run.run_record.results_problem` accepts for ``config``; any other
  run resumes from its last checkpoint).

  Returns:
    ``results.json`` plus ``"val_curve"``: ``[[step, accuracy], ...]`` from
    ``metrics.jsonl`` and ``"workdir"``.

  Raises:
    ValueError: if ``workdir`` holds a run of another config: its ``config.json`` has another
      :func:`simpletron_jax.run.run_record.config_fingerprint` (choose another ``--runs``).
  """
  from simpletron_jax.train import trainer  # pylint: disable=import-outside-toplevel
  path = os.path.join(workdir, "results.json")
  saved = os.path.join(workdir, "config.json")
  if os.path.exists(saved):
    with open(saved) as f:
      tree = json.load(f)
    # Only the config's own fields: config.json also records what ran it (the software).
    tree = {k: v for k, v in tree.items() if k in config and k != run_record.CONFIG_HISTORY_KEY}
    if run_record.config_fingerprint(tree) != run_record.config_fingerprint(config):
      raise ValueError(f"{workdir} holds a run with another config; pass another --runs "
                       "folder or delete it")
  if finished(workdir, config):
    with open(path) as f:
      results = json.load(f)
  else:   # none yet, or e.g. stopped by max_train_minutes: resume from its checkpoint
    results = trainer.train_and_evaluate(config, workdir, data=data)
  records = read_records(os.path.join(workdir, "metrics.jsonl"))
  curve = {r["step"]: r["accuracy"] for r in records if r.get("split") == "val"}
  return {**results, "val_curve": sorted(curve.items()), "workdir": workdir}


def evaluate_params(config: ml_collections.ConfigDict, params, data: tasks.TaskData,
                    split: str = "test") -> dict[str, float]:
  """Accuracy and loss of ``params`` in the model of ``config`` on ``split``, of
  ``num_test_steps`` batches of the test split, ``num_eval_steps`` of the others (as
  ``final_test.evaluate_checkpoint``)."""
  # pylint: disable=import-outside-toplevel
  from simpletron_jax.data import batches
  from simpletron_jax.train import evaluation, run_config, steps, train_state
  model = train_state.build_model(run_config.RunConfig.from_config_dict(config), data)
  _, p_eval = steps.pmap_steps(model.apply)
  limit = config.get("num_test_steps" if split == "test" else "num_eval_steps", -1)
  return evaluation.evaluate(p_eval, steps.replicate(params), getattr(data, split),
                             batches.BatchConfig.from_config_dict(config), limit)


def init_params(config: ml_collections.ConfigDict, data: tasks.TaskData):
  """Freshly initialised parameters of the model of ``config`` (seed ``config.seed``)."""
  import jax  # pylint: disable=import-outside-toplevel
  from simpletron_jax.train import run_config, train_state  # pylint: disable=C0415
  run = run_config.RunConfig.from_config_dict(config)
  return train_state.create_train_state(
      run.train, train_state.build_model(run, data), jax.random.PRNGKey(config.seed),
      config.model.max_length).params


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
  """A GitHub markdown table; floats are written with 4 significant decimals."""
  def cell(v):
    return f"{v:.4f}" if isinstance(v, float) else str(v)
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
  return "\n".join(lines) + "\n"


def write_outputs(out_dir: str, name: str, payload: dict, table_md: str,
                  plot: Callable[[Any], None]) -> dict[str, str]:
  """Writes ``payload`` (JSON-ready), ``table_md`` and what ``plot`` draws on a matplotlib
  Figure (Agg) to ``out_dir/<name>.{json,md,png}``, the folder created; returns the paths,
  ``{"json", "md", "png"}``."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=import-outside-toplevel
  os.makedirs(out_dir, exist_ok=True)
  paths = {ext: os.path.join(out_dir, f"{name}.{ext}") for ext in ("json", "md", "png")}
  with open(paths["json"], "w") as f:
    json.dump(payload, f, indent=2, default=float)
  with open(paths["md"], "w") as f:
    f.write(table_md)
  fig = plt.figure(figsize=(10, 4))
  plot(fig)
  fig.tight_layout()
  fig.savefig(paths["png"], dpi=110)
  plt.close(fig)
  return paths
