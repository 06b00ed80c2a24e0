"""The paper cells: one command per published number, trained, tested and compared.

Usage::

    python scripts/reproduce.py --list                       # the cells, in plan order
    python scripts/reproduce.py listops_transformer_lra_code # train, test, compare
    python scripts/reproduce.py text_simple_authors --config.data.data_dir=~/data/imdb \\
        --config.max_train_minutes=8                         # stop after 8 minutes of training
    python scripts/reproduce.py text_simple_authors --config.data.data_dir=~/data/imdb \\
        --copy_to results/paper/text_simple_authors          # rerun: resume, then copy the logs
    python scripts/reproduce.py listops_simple --rehearse    # a CPU rehearsal: not a result

A cell is a config file, the flags the GPU run uses (``Cell.flags``: dtype, the speed
options, the validation frequency; ``Cell.train_flags``: train.py's own, such as
``--precompile_workers``) and the published number it is compared with. The options not yet
timed on a GPU are marked so in docs/reproduce.md. The command
runs ``train.py --config <config> <flags> <overrides> --workdir <workdir>`` (default workdir
``runs/paper/<cell>``), which resumes from the workdir's newest checkpoint, so rerunning a
stopped cell continues it. When the run is finished (``run_record.workdir_results_problem``:
complete, every step, this config's fingerprint) it writes ``comparison.md`` (our test
accuracy under the publication's protocol against the published number,
``simpletron_jax.tools.reporting``) and ``reproduce.json`` (cell, command, device, the row) into
the workdir. Only ``--copy_to DIR`` writes elsewhere: it copies ``config.json``,
``metrics.jsonl``, ``results.json``, ``comparison.md`` and ``reproduce.json`` (never
checkpoints) to ``DIR``. ``reproduce.json``'s ``flags`` are the ``--config.*`` flags
``train.py`` was given after the config, as they ran (the cell's, with a ``final_only`` cell's
validation step computed from the overrides, then the overrides).

``--rehearse`` runs a cell's whole path (its flags, train.py, the test, the comparison files)
in minutes on a CPU, to check a command before a GPU slot: the cell's config at its ``:tiny``
size (``:authors`` becomes ``:tiny_authors``, ``:lra_code`` ``:tiny_lra_code``), trained for
:data:`REHEARSAL_STEPS` steps, on 64/32/32 generated examples where the task generates its
data (ListOps). Its workdir is ``runs/paper_rehearsal/<cell>``; its row in ``comparison.md``
and ``reproduce.json`` reads "rehearsal, not a result", with no published number and no gap;
``reproduce.json`` has ``"rehearsal": true``; ``--copy_to`` is refused.

Exit status: 0 when the cell is finished and compared; 3 when ``train.py`` stopped early on
its time budget (``config.max_train_minutes``: rerun the same command to continue); 75 when
it was preempted (likewise); 1 with one line for any other named cause. The plan, the budget
of each cell and the GPU procedure are in docs/reproduce.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from typing import Any, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

UNFINISHED_EXIT_CODE = 3
# --rehearse: the steps, the validation and checkpoint frequency, and the generated data sizes.
REHEARSAL_STEPS = 4
REHEARSAL_FLAGS = (f"--config.num_train_steps={REHEARSAL_STEPS}", "--config.eval_frequency=2",
                   "--config.checkpoint_every=2", "--config.warmup=1")
REHEARSAL_DATA = {"num_train": 64, "num_val": 32, "num_test": 32}   # where config.data has them
REHEARSAL_LABEL = "rehearsal, not a result"
# A cell's :variant -> the variant of its :tiny size (--rehearse).
REHEARSAL_VARIANTS = {"": "tiny", "authors": "tiny_authors", "lra_code": "tiny_lra_code"}
COPIED_FILES = ("config.json", "metrics.jsonl", "results.json", "comparison.md",
                "reproduce.json")
# The GPU setting of every cell: bfloat16 activations and matmuls, float32 parameters and
# optimizer state (docs/scaling.md, "Which dtype": the closer match to LRA's TPU runs).
BF16 = "--config.model.dtype=bfloat16"
# Exact for CLS pooling; 1.16x a simple step at 4K on an H100 (docs/fast_paths.md).
CLS_ONLY = "--config.model.last_block_cls_only=True"
# Every batch at full width: one train and one eval program instead of one per 128-token
# width met (up to 16 on ListOps, 32 on text; 9 to 27 s each on an H100), for the models that
# are exact under length padding (mask_pads=True, tested), so the function is the default's.
FULL_WIDTH = "--config.data.bucket=0"
# Simple's products on the heads side by side (the same function, tested), and the length
# padded with masked positions to a multiple of 8 (exact for the padding-exact models only;
# refused for the authors' function): on an H200, 1.38x and 1.15x the text model's step at 4K,
# 1.94x with CLS_ONLY, and 1.22x together on ListOps in train.py (docs/fast_paths.md). Timed
# on the text and ListOps models only, so the image and Pathfinder cells go without.
BLOCK_DIAGONAL = "--config.model.attention_kwargs.block_diagonal=True"
LENGTH_MULTIPLE = "--config.model.length_multiple=8"
# Validation and test in batches of 500 rows (4 a split on ListOps' 2,000 examples, no filler
# row) instead of the micro-batch's 32 (63 batches): the same examples, the same frequency and
# the same metrics (summed on the device and read once per validation; equal to batch 32's
# within float32 summation, tests/test_eval_batch.py). For the cells that validate every 50
# steps (300 validations). Its speed is modelled, to be timed by the next GPU slot.
EVAL_BATCH = "--config.eval_batch_size=500"
# A checkpoint every 1,000 steps instead of the recipe's 200, on the ListOps cells that must
# fit one slot (1, 4, 5b): for 4 and 5b, 15 saves of the 233-MB train state (2.3 s each on an
# H200, benchmarks/paper_budget.py) instead of 75. How the run is executed, not what it
# computes (run_record.RESUME_ALLOWED_FIELDS); a call's time budget and a preemption save the
# step they stop at anyway. To be timed by the next GPU slot.
CHECKPOINT_EVERY = "--config.checkpoint_every=1000"
# At most four widths for the padding-exact ListOps cell: buckets of 512 tokens (512, 1024,
# 1536 and max_length 2000; with CLS and length_multiple=8: 520, 1032, 1544, 2008; ListOps'
# examples are longer than 500 tokens, so 512 is almost never met), the
# train batches grouped by length (data.group_by_length: pools of 50 batches sorted by length,
# the batch order shuffled; every epoch still reads each example once), and every width's
# train and eval step compiled before the loop, 8 side by side (PRECOMPILE). The model is exact
# under length padding, so each example's logits and gradients are those at full width
# (tests/test_eval_batch.py); what changes is which examples share a batch. To be timed by
# the next GPU slot.
BOUNDED_WIDTHS = ("--config.data.bucket=512", "--config.data.group_by_length=True")
PRECOMPILE = "--precompile_workers=8"


@dataclasses.dataclass(frozen=True)
class Cell:
  """One published number and the run that reproduces it.

  Attributes:
    name: ``<task>_<model>[_<variant>]``, the run folder's name.
    config: a config file with its ``:variant`` (``configs/<task>/<model>.py[:variant]``).
    flags: ``--config.<field>=<value>`` flags of the GPU run, after the config's own values.
    note: why the cell exists and what it compares (one sentence).
    final_only: scored on the final parameters (LRA's protocol), so it validates once, at
      the last step (``--config.eval_frequency=<num_train_steps>``): the validation frequency
      changes no reported number there, and LRA's own text config validates on the 25,000
      test reviews every 100 steps.
    train_flags: ``train.py`` flags that are not config fields (``--precompile_workers=N``);
      they change how the run is executed, not what it computes.
  """

  name: str
  config: str
  flags: tuple[str, ...]
  note: str
  final_only: bool = False
  train_flags: tuple[str, ...] = ()

  @property
  def task(self) -> str:
    """The task folder of :attr:`config` (``listops``, ``text``, ...)."""
    return self.config.split("/")[1]


# Plan order (issue 43): LRA's Transformer, SimpleTRON's simple (authors' function, then the
# padding-exact default), LRA's linear and Performer on ListOps, then image and Pathfinder-32.
CELLS: tuple[Cell, ...] = (
    Cell("listops_transformer_lra_code", "configs/listops/transformer.py:lra_code",
         (BF16, CLS_ONLY, CHECKPOINT_EVERY),
         "LRA's Transformer as LRA's code ran it (LRA Table 1: 36.37, final step)",
         final_only=True),
    Cell("text_transformer_lra_code", "configs/text/transformer.py:lra_code",
         (BF16, CLS_ONLY),
         "LRA's Transformer on bytes, max_length 1000 as LRA's code (LRA Table 1: 64.27)",
         final_only=True),
    Cell("text_simple_authors", "configs/text/simple.py:authors",
         (BF16, CLS_ONLY, BLOCK_DIAGONAL),
         "SimpleTRON as its authors' code computed it (paper: 66.75, best-validation)"),
    Cell("listops_simple_authors", "configs/listops/simple.py:authors",
         (BF16, CLS_ONLY, BLOCK_DIAGONAL, EVAL_BATCH, CHECKPOINT_EVERY),
         "SimpleTRON as its authors' code computed it (paper: 37.45, best-validation)"),
    Cell("text_simple", "configs/text/simple.py",
         (BF16, CLS_ONLY, FULL_WIDTH, BLOCK_DIAGONAL, LENGTH_MULTIPLE),
         "the padding-exact Simple (pads out of K^T V, L = real length), beside the authors'"),
    Cell("listops_simple", "configs/listops/simple.py",
         (BF16, CLS_ONLY, *BOUNDED_WIDTHS, BLOCK_DIAGONAL, LENGTH_MULTIPLE, EVAL_BATCH,
          CHECKPOINT_EVERY),
         "the padding-exact Simple, beside the authors'", train_flags=(PRECOMPILE,)),
    Cell("listops_linear_lra_code", "configs/listops/linear.py:lra_code",
         (BF16, CLS_ONLY),
         "LRA's Linear Transformer, no padding mask (LRA Table 1: 16.13)",
         final_only=True),
    Cell("listops_performer_lra_code", "configs/listops/performer.py:lra_code",
         (BF16, CLS_ONLY),
         "LRA's Performer, features redrawn from sum(q) (LRA Table 1: 18.01)",
         final_only=True),
    Cell("image_transformer_lra_code", "configs/image/transformer.py:lra_code",
         (BF16, CLS_ONLY),
         "LRA's Transformer on CIFAR-10 gray (LRA Table 1: 42.44)",
         final_only=True),
    Cell("image_simple", "configs/image/simple.py", (BF16, CLS_ONLY),
         "Simple on LRA's image recipe (no published number; beside the Transformer)"),
    Cell("pathfinder_transformer_lra_code", "configs/pathfinder/transformer.py:lra_code",
         (BF16,),
         "LRA's Transformer on Pathfinder-32 hard, MEAN pooling (LRA Table 1: 71.40)",
         final_only=True),
    Cell("pathfinder_simple", "configs/pathfinder/simple.py", (BF16,),
         "Simple on LRA's Pathfinder-32 recipe (no published number; beside the Transformer)"),
)


class CellError(RuntimeError):
  """A cell could not be run or compared; the message is one line."""


def get_cell(name: str) -> Cell:
  """The cell called ``name``.

  Raises:
    CellError: for an unknown name (the known ones are listed).
  """
  for cell in CELLS:
    if cell.name == name:
      return cell
  raise CellError(f"unknown cell {name!r}; known: {', '.join(c.name for c in CELLS)}")


def _load(cell: Cell, args: Sequence[str]):
  """``overrides.load_config`` of the cell's config file with ``args``; CellError on failure."""
  from simpletron_jax.runtime import overrides as overrides_lib  # pylint: disable=C0415
  try:
    return overrides_lib.load_config(cell.config, args)
  except ValueError as e:
    raise CellError(f"{cell.name}: {e}") from None


def rehearsal_cell(cell: Cell) -> Cell:
  """The cell as ``--rehearse`` runs it (see the module docstring): its config at the
  ``:tiny`` size, its flags followed by :data:`REHEARSAL_FLAGS` and the small data sizes.

  Raises:
    CellError: the cell's variant has no tiny counterpart, or its config cannot be loaded.
  """
  path, _, variant = cell.config.partition(":")
  if variant not in REHEARSAL_VARIANTS:
    raise CellError(f"{cell.name}: no :tiny size for the variant {variant!r} to rehearse")
  tiny = dataclasses.replace(cell, config=f"{path}:{REHEARSAL_VARIANTS[variant]}")
  data = _load(tiny, []).data
  sizes = tuple(f"--config.data.{k}={v}" for k, v in REHEARSAL_DATA.items() if k in data)
  return dataclasses.replace(tiny, flags=(*cell.flags, *REHEARSAL_FLAGS, *sizes),
                             note=f"{REHEARSAL_LABEL}: {cell.note}")


def cell_overrides(cell: Cell, overrides: Sequence[str] = ()) -> list[str]:
  """The cell's flags (with the one-validation flag of a ``final_only`` cell, at the step
  count these flags and overrides give), then the user's ``--config.*`` overrides, which win.

  Raises:
    CellError: the config or an override cannot be loaded (one line).
  """
  flags = list(cell.flags)
  if cell.final_only:
    steps = _load(cell, [*flags, *overrides]).num_train_steps
    flags.append(f"--config.eval_frequency={steps}")
  return [*flags, *overrides]


def cell_config(cell: Cell, overrides: Sequence[str] = ()):
  """The ``ml_collections.ConfigDict`` that ``train.py`` trains for this cell and these
  overrides, parsed by ml_collections' config flags as train.py parses it.

  Raises:
    CellError: the config or an override cannot be loaded (one line).
  """
  return _load(cell, cell_overrides(cell, overrides))


def train_command(cell: Cell, workdir: str, overrides: Sequence[str] = ()) -> list[str]:
  """``train.py``'s argument list for the cell (without the interpreter), relative to the
  repository root, where :func:`main` runs it: the config, the workdir, the cell's
  ``train_flags``, then :func:`cell_overrides`."""
  return ["train.py", "--config", cell.config, "--workdir", workdir, *cell.train_flags,
          *cell_overrides(cell, overrides)]


def user_command(cell: Cell, overrides: Sequence[str] = ()) -> str:
  """The command a user types for the cell, as docs/reproduce.md gives it."""
  return " ".join(["python scripts/reproduce.py", cell.name, *overrides])


def _device() -> dict[str, Any]:
  """``{"device_kind", "device_count", "platform"}`` of this process's JAX backend."""
  from simpletron_jax.runtime import platforms  # pylint: disable=import-outside-toplevel
  platforms.skip_absent_tpu()   # as train.py: no libtpu start-up on a machine without a TPU
  import jax  # pylint: disable=import-outside-toplevel
  devices = jax.devices()
  return {"device_kind": devices[0].device_kind, "device_count": len(devices),
          "platform": devices[0].platform}


def compare(cell: Cell, workdir: str, overrides: Sequence[str] = (),
            rehearsal: bool = False) -> dict[str, Any]:
  """Writes ``comparison.md`` and ``reproduce.json`` for a finished run in ``workdir``;
  ``rehearsal``: a ``--rehearse`` run (:func:`rehearsal_cell`), whose row is labelled
  :data:`REHEARSAL_LABEL` and compared with nothing. A run whose overrides moved it off the
  published cell's size, length or protocol (``reporting.comparability_problem`` against
  ``compare.paper_configs``) gets no gap either; its row says why.

  Returns:
    The comparison row (``simpletron_jax.tools.reporting.comparison_rows``), with ``ours`` and
    ``published`` in % and ``gap`` in points.

  Raises:
    CellError: the run is not finished for this cell's config (the reason from
      ``run_record.workdir_results_problem``).
  """
  from simpletron_jax.tools import reporting  # pylint: disable=import-outside-toplevel
  from simpletron_jax.run import run_record  # pylint: disable=import-outside-toplevel
  import compare as compare_script  # pylint: disable=import-outside-toplevel  (scripts/)
  config = cell_config(cell, overrides)
  problem = run_record.workdir_results_problem(workdir, config)
  if problem is not None:
    raise CellError(f"{cell.name}: {workdir} is not a finished run of this cell: {problem}")
  with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
    results = json.load(f)
  label = f"{cell.name} ({REHEARSAL_LABEL})" if rehearsal else cell.name
  group = reporting.RunGroup(label, config.task, config.model.attention,
                             {int(config.seed): results})
  # A rehearsal is never read as a reproduction; a cell run with overrides that change its
  # size, length or protocol (e.g. --config.num_train_steps) is not compared either.
  problem = (f"{REHEARSAL_LABEL}: the cell's path at the :tiny size for "
             f"{config.num_train_steps} steps" if rehearsal else
             reporting.comparability_problem(
                 config, compare_script.paper_configs(config.task, config.model.attention)))
  row = reporting.comparison_rows([group], {label: problem})[0]
  command = user_command(cell, [*overrides, "--rehearse"] if rehearsal else overrides)
  heading = f"`{command}`\n\n"
  if rehearsal:
    heading += (f"**{REHEARSAL_LABEL.capitalize()}**: the cell's path at the :tiny size for "
                f"{config.num_train_steps} steps; its accuracy says nothing about the "
                "published number.\n\n")
  table = reporting.comparison_markdown([row])
  with open(os.path.join(workdir, "comparison.md"), "w", encoding="utf-8") as f:
    f.write(f"{heading}{table}")
  record = {"cell": cell.name, "rehearsal": rehearsal, "config": cell.config,
            "flags": cell_overrides(cell, overrides),
            "overrides": list(overrides), "command": command,
            "train_command": " ".join(["python", *train_command(cell, workdir, overrides)]),
            **_device(), "steps_per_sec": results.get("steps_per_sec"),
            "train_seconds": results.get("train_seconds"),
            "row": {k: v for k, v in row.items() if k != "summary"}}
  with open(os.path.join(workdir, "reproduce.json"), "w", encoding="utf-8") as f:
    json.dump(record, f, indent=2)
  print(table, end="")
  return row


def copy_logs(workdir: str, dest: str) -> list[str]:
  """Copies :data:`COPIED_FILES` (never checkpoints) from ``workdir`` to ``dest``.

  Returns:
    The copied paths.

  Raises:
    CellError: ``dest`` exists and is not a folder, or a file is missing from ``workdir``.
  """
  if os.path.exists(dest) and not os.path.isdir(dest):
    raise CellError(f"--copy_to {dest} is a file, not a folder")
  missing = [n for n in COPIED_FILES if not os.path.isfile(os.path.join(workdir, n))]
  if missing:
    raise CellError(f"{workdir} lacks {', '.join(missing)}: nothing copied")
  os.makedirs(dest, exist_ok=True)
  return [shutil.copy(os.path.join(workdir, n), dest) for n in COPIED_FILES]


def plan_markdown() -> str:
  """One line per cell: its name, config, flags and note (``--list``)."""
  lines = ["| cell | config | GPU flags | what |", "|---|---|---|---|"]
  for c in CELLS:
    flags = " ".join(f"`{f}`" for f in (*c.flags, *c.train_flags))
    if c.final_only:
      flags += " `--config.eval_frequency=<num_train_steps>`"
    lines.append(f"| `{c.name}` | `{c.config}` | {flags} | {c.note} |")
  return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
  """Parses the flags, trains the cell (resuming), compares it and copies its logs.

  Returns:
    The exit status (see the module docstring).
  """
  from simpletron_jax.runtime import cli  # pylint: disable=import-outside-toplevel
  parser = cli.ArgumentParser(prog="reproduce.py", description=__doc__.split("\n\n")[0])
  parser.add_argument("cell", nargs="?", help="a cell name (--list shows them)")
  parser.add_argument("--list", action="store_true", help="print the cells and exit")
  parser.add_argument("--workdir", default=None, help="default: runs/paper/<cell>")
  parser.add_argument("--copy_to", default=None,
                      help="copy the run's logs (no checkpoints) here when it is finished")
  parser.add_argument("--rehearse", action="store_true",
                      help="a CPU rehearsal of the cell: its :tiny size for "
                      f"{REHEARSAL_STEPS} steps, in runs/paper_rehearsal/<cell>; its row "
                      f"reads '{REHEARSAL_LABEL}'")
  args, overrides = parser.parse_known_args(argv)
  if args.list:
    print(plan_markdown(), end="")
    return 0
  bad = [o for o in overrides if not o.startswith("--config.")]
  try:
    if bad:
      raise CellError(f"unrecognized arguments {bad}: only --config.<field>=<value> "
                      "overrides are passed on to train.py")
    if not args.cell:
      raise CellError("name a cell (python scripts/reproduce.py --list shows them)")
    cell = get_cell(args.cell)
    if args.rehearse and args.copy_to:
      raise CellError("--copy_to copies a result; a --rehearse run is not one, so it stays in "
                      "its workdir")
    if args.copy_to and os.path.exists(args.copy_to) and not os.path.isdir(args.copy_to):
      raise CellError(f"--copy_to {args.copy_to} is a file, not a folder")
    if args.rehearse:
      cell = rehearsal_cell(cell)
    config = cell_config(cell, overrides)   # a bad override fails here, before training
    workdir = args.workdir or os.path.join(
        ROOT, "runs", "paper_rehearsal" if args.rehearse else "paper", cell.name)
    cmd = [sys.executable, *train_command(cell, workdir, overrides)]
    print(f"reproduce.py: {cell.name}: {' '.join(cmd[1:])}", flush=True)
    status = subprocess.call(cmd, cwd=ROOT)
    if status == 75:
      print(f"reproduce.py: {cell.name} was preempted after saving; rerun the same command "
            "to continue", file=sys.stderr)
      return status
    if status != 0:
      raise CellError(f"train.py exited {status} (its last lines above name the cause)")
    from simpletron_jax.run import run_record  # pylint: disable=import-outside-toplevel
    problem = run_record.workdir_results_problem(workdir, config)
    if problem is not None:
      print(f"reproduce.py: {cell.name} is not finished ({problem}); rerun the same command "
            "to continue from its last checkpoint", file=sys.stderr)
      return UNFINISHED_EXIT_CODE
    compare(cell, workdir, overrides, rehearsal=args.rehearse)
    if args.copy_to:
      copy_logs(workdir, args.copy_to)
      print(f"reproduce.py: copied {', '.join(COPIED_FILES)} to {args.copy_to}")
  except CellError as e:
    print(f"reproduce.py: {e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
