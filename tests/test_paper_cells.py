"""Every paper cell of scripts/reproduce.py (docs/reproduce.md), smoke-tested on CPU at full size.

Each cell's config is built exactly as its command builds it (the config file, its variant,
the cell's GPU flags: bfloat16, the speed options, the validation frequency), checked, then
cut only in what a CPU cannot afford and a GPU crash does not depend on: the global batch
(2, one example per fake device), the step counts (2 train steps, 1 validation and 1 test
batch) and the data: the task's reader or generator runs on a few fixture or generated
examples, then each split becomes 4 copies of its longest example tiled to ``max_length``,
so that every batch has the paper's full width and each cell compiles one train and one
eval program. The model, its
dtype, its attention implementation and every option stay the cell's. Each cell then trains
2 steps, validates, tests and writes results.json through ``trainer.train_and_evaluate``.
These compile 12 full-size models (several minutes on 2 cores), so they are marked
``paper_cells`` and run as CI's second step, ``python -m pytest tests -q -n 2 --paper-cells
-m paper_cells`` (docs/testing.md).

No cell uses ``implementation="flash"``: LRA's Transformer has attention dropout 0.1, which no
fused kernel has, so its cells run ``einsum`` (the softmax of LRA's code) on a GPU too; the
test checks this, since on a CPU a flash cell would run another kernel (its XLA fallback)
than on the GPU.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import sys

import numpy as np
import pytest

from simpletron_jax.data import image, tasks, text
from simpletron_jax.data.common import RaggedExamples
from simpletron_jax.train import trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import reproduce  # noqa: E402  pylint: disable=wrong-import-position

CELL_NAMES = [c.name for c in reproduce.CELLS]


@pytest.fixture(scope="module")
def data_dirs(tmp_path_factory):
  """Fixture copies of the file-backed tasks, laid out as their readers expect, with
  examples at or past the paper's lengths (text reviews of 4,100 bytes; 32 x 32 images)."""
  root = tmp_path_factory.mktemp("paper_data")
  rng = np.random.default_rng(0)
  imdb = root / "imdb"
  imdb.mkdir()
  for split, name in text.JSONL_FILES.items():
    with gzip.open(imdb / name, "wt", encoding="utf-8") as f:
      for i in range(20):
        words = rng.choice(["good", "bad", "film", "plot", "actor", "long"], size=900)
        review = " ".join(words)[: 1000 + 155 * i]   # 1,000 to 3,945 bytes, then longer
        review = review if i < 18 else review + " x" * 300  # two past 4,000 bytes (truncated)
        f.write(json.dumps({"text": review, "label": int(i % 2)}) + "\n")
  cifar = root / "cifar10"
  cifar.mkdir()
  x = rng.integers(0, 256, size=(40, 32, 32), dtype=np.uint8)
  y = (np.arange(40) % 10).astype(np.int64)
  np.savez(cifar / image.NPZ_NAME, x_train=x, y_train=y, x_test=x[:10], y_test=y[:10])
  return {"text": str(imdb), "image": str(cifar), "cache": str(root / "cache")}


def smoke_config(cell: reproduce.Cell, data_dirs: dict[str, str]):
  """The cell's config, then the CPU cuts of the module docstring."""
  config = reproduce.cell_config(cell)
  config.unlock()
  config.batch_size = 2
  config.eval_batch_size = 2
  config.num_train_steps = 2
  config.eval_frequency = 2
  config.checkpoint_every = 2
  config.num_eval_steps = 1
  config.num_test_steps = 1
  config.log_every = 1
  config.data.cache_dir = data_dirs["cache"]
  if cell.task in ("text", "image"):
    config.data.data_dir = data_dirs[cell.task]
  if cell.task == "listops":   # generated at LRA's lengths (500 < tokens < 2000)
    config.data.num_train, config.data.num_val, config.data.num_test = 16, 4, 4
  if cell.task == "pathfinder":
    config.data.num_images = 60
  return config


def test_plan_order_and_published_numbers():
  """The plan's order and its published numbers are issue 43's; each cell's command parses."""
  from simpletron_jax.experiments import published  # pylint: disable=import-outside-toplevel
  expected = {"listops_transformer_lra_code": 36.37, "text_transformer_lra_code": 64.27,
              "text_simple_authors": 66.75, "listops_simple_authors": 37.45,
              "text_simple": 66.75, "listops_simple": 37.45,
              "listops_linear_lra_code": 16.13, "listops_performer_lra_code": 18.01,
              "image_transformer_lra_code": 42.44, "pathfinder_transformer_lra_code": 71.40}
  assert CELL_NAMES[:8] == list(expected)[:8]
  for cell in reproduce.CELLS:
    config = reproduce.cell_config(cell)
    entry = published.lookup(config.model.attention, config.task)
    if cell.name in expected:
      assert entry is not None and entry.accuracy == expected[cell.name], cell.name
    else:
      assert cell.name in ("image_simple", "pathfinder_simple")
      assert entry is None or entry.accuracy is None


@pytest.mark.parametrize("name", CELL_NAMES)
def test_cell_settings(name):
  """What the GPU runs: bfloat16, LRA's einsum softmax, one validation under LRA's protocol,
  the paper's validation frequency under SimpleTRON's, the variant's function."""
  cell = reproduce.get_cell(name)
  config = reproduce.cell_config(cell)
  assert config.model.dtype == "bfloat16"
  kwargs = config.model.attention_kwargs
  if config.model.attention == "softmax":
    assert kwargs.implementation == "einsum"
    assert config.model.attention_dropout_rate > 0   # why flash is not used
  if name.endswith("_lra_code"):
    assert config.eval_frequency == config.num_train_steps   # LRA's protocol: final step
    assert config.data.bucket == 0 and config.model.lra_cls_mask
  else:
    assert config.eval_frequency < config.num_train_steps
  if name.endswith("_authors"):
    assert not kwargs.mask_pads and kwargs.normalizer == "padded" and config.data.bucket == 0
  if name == "text_simple":   # padding-exact, so full width is exact
    assert kwargs.mask_pads and kwargs.normalizer != "padded" and config.data.bucket == 0
  if name == "listops_simple":   # padding-exact, so a few widths are exact (issue 60)
    assert kwargs.mask_pads and kwargs.normalizer != "padded"
    assert config.data.bucket == 512 and config.data.group_by_length
    assert reproduce.PRECOMPILE in cell.train_flags
  else:
    assert not config.data.group_by_length and not cell.train_flags
  # The ListOps SimpleTRON cells validate every 50 steps: in batches of 500, 4 a split of
  # 2,000, none of them with filler rows (the same examples and metrics, test_eval_batch.py).
  if name in ("listops_simple_authors", "listops_simple"):
    assert config.eval_batch_size == 500 and config.data.num_val % 500 == 0
  else:
    assert config.eval_batch_size == 0
  # The ListOps cells that must fit one slot save every 1,000 steps, not every 200.
  slot_cells = ("listops_transformer_lra_code", "listops_simple_authors", "listops_simple")
  assert (config.checkpoint_every == 1000) == (name in slot_cells)
  # Simple's GPU options, timed on the text and ListOps models (docs/fast_paths.md).
  timed = config.task in ("text", "listops") and config.model.attention == "simple"
  assert bool(kwargs.get("block_diagonal", False)) == timed
  assert config.model.length_multiple == (8 if timed and kwargs.mask_pads else 1)
  assert config.model.last_block_cls_only == (config.model.classifier_pool == "CLS")


def full_width(data: tasks.TaskData, max_length: int, n: int = 4) -> tasks.TaskData:
  """Each split as ``n`` copies of its longest example, tiled to ``max_length`` tokens."""
  def widen(split: RaggedExamples) -> RaggedExamples:
    lengths = np.diff(split.offsets)
    i = int(np.argmax(lengths))
    seq = np.resize(split.tokens[split.offsets[i]:split.offsets[i + 1]], max_length)
    return RaggedExamples.from_sequences([seq] * n, np.resize(split.labels, n),
                                         dtype=split.tokens.dtype,
                                         explicit_mask=split.explicit_mask)
  return tasks.TaskData(widen(data.train), widen(data.val), widen(data.test), data.vocab_size,
                        data.num_classes, data.source)


@pytest.mark.paper_cells
@pytest.mark.parametrize("name", CELL_NAMES)
def test_cell_trains_two_steps_on_cpu(name, data_dirs, tmp_path):
  """2 train steps, a validation batch and a test batch of the full-size cell, on CPU."""
  cell = reproduce.get_cell(name)
  config = smoke_config(cell, data_dirs)
  data = full_width(tasks.load_task(tasks.data_config(config)), config.model.max_length)
  results = trainer.train_and_evaluate(config, str(tmp_path / name), data=data)
  assert results["final_step"] == 2
  for key in ("test_accuracy_final", "test_accuracy_best_val", "test_loss_final"):
    assert math.isfinite(results[key]), key
  with open(tmp_path / name / "config.json", encoding="utf-8") as f:
    saved = json.load(f)
  assert saved["model"]["dtype"] == "bfloat16"
  assert saved["model"]["max_length"] == reproduce.cell_config(cell).model.max_length


def test_command_line(tmp_path, capsys):
  """The user's command: unknown cells and stray arguments are one line; --list is the plan."""
  assert reproduce.main(["--list"]) == 0
  out = capsys.readouterr().out
  assert all(f"`{n}`" in out for n in CELL_NAMES)
  assert f"`{reproduce.PRECOMPILE}`" in out
  command = reproduce.train_command(reproduce.get_cell("listops_simple"), "w")
  assert command[:5] == ["train.py", "--config", "configs/listops/simple.py", "--workdir", "w"]
  assert command[5] == reproduce.PRECOMPILE   # a train.py flag, before the config overrides
  assert reproduce.main(["no_such_cell"]) == 1
  assert "unknown cell 'no_such_cell'" in capsys.readouterr().err
  assert reproduce.main(["listops_simple", "--seed=1"]) == 1
  assert "only --config.<field>=<value>" in capsys.readouterr().err
  assert reproduce.main(["listops_simple", "--config.no_such_field=1"]) == 1
  assert "no_such_field" in capsys.readouterr().err
  afile = tmp_path / "file"
  afile.write_text("x")
  assert reproduce.main(["listops_simple", "--copy_to", str(afile)]) == 1
  assert "is a file, not a folder" in capsys.readouterr().err


@pytest.mark.paper_cells
def test_a_cell_stops_resumes_compares_and_copies(tmp_path, monkeypatch, capsys):
  """The command's whole path on a :tiny cell: a time budget stops it (exit 3, nothing copied),
  the same command resumes and finishes it, writes the comparison row and copies the logs."""
  cell = reproduce.Cell("listops_simple_tiny", "configs/listops/simple.py:tiny",
                        ("--config.num_train_steps=6", "--config.eval_frequency=3",
                         "--config.checkpoint_every=1", "--config.num_eval_steps=2",
                         "--config.num_test_steps=2", "--config.data.num_train=256"),
                        "a CPU cell for this test")
  monkeypatch.setattr(reproduce, "CELLS", (cell,))
  workdir, dest = str(tmp_path / "run"), str(tmp_path / "copy")
  args = [cell.name, "--workdir", workdir, "--copy_to", dest,
          f"--config.data.cache_dir={tmp_path / 'cache'}"]
  assert reproduce.main(args + ["--config.max_train_minutes=0.0001"]) == 3
  assert "not finished" in capsys.readouterr().err and not os.path.exists(dest)
  assert reproduce.main(args) == 0
  with open(os.path.join(dest, "reproduce.json"), encoding="utf-8") as f:
    record = json.load(f)
  # A :tiny cell of 6 steps is not the published cell: its row has no published number and no
  # gap, and says why (scripts/compare.py's rule, reporting.comparability_problem).
  row = record["row"]
  assert record["cell"] == cell.name and row["published"] is None and row["gap"] is None
  assert row["reason"].startswith("another size, length and protocol than the published cell: "
                                  "model.emb_dim 64 (published 512)"), row["reason"]
  with open(os.path.join(dest, "results.json"), encoding="utf-8") as f:
    results = json.load(f)
  assert results["final_step"] == 6
  with open(os.path.join(dest, "comparison.md"), encoding="utf-8") as f:
    comparison = f.read()
  assert "### Not compared with a published number" in comparison and "37.45" not in comparison
  assert f"| {100 * results['test_accuracy_best_val']:.2f} ± 0.00 / " in comparison
  assert sorted(os.listdir(dest)) == sorted(reproduce.COPIED_FILES)
