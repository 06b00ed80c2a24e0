"""The task registry (simpletron_jax/data/tasks.py, docs/tasks.md): one data record per task,
registered by its own module and read by the configs, the data command, tpu_aot and the config
checks; its recipe (simpletron_jax/experiments/recipes.py), read by the configs and pretraining."""

import dataclasses
import glob
import os
import re

import numpy as np
import pytest

from configs import lra
from simpletron_jax.data import __main__ as data_cli
from simpletron_jax.data import prepare, sources, tasks
from simpletron_jax.data.common import RaggedExamples
from simpletron_jax.experiments import published, recipes
from simpletron_jax.tools import tpu_aot
from simpletron_jax.train import pretraining, run_config
from tests.conftest import ROOT


def test_every_task_has_one_config_folder_and_lra_order():
  folders = {os.path.basename(os.path.dirname(f))
             for f in glob.glob(os.path.join(ROOT, "configs", "*", "__init__.py"))}
  assert folders == set(tasks.names())
  assert tasks.lra_tasks() == ("listops", "text", "retrieval", "image", "pathfinder", "pathx")
  assert "agnews" in tasks.names() and not tasks.get("agnews").lra


def test_records_are_frozen_and_hold_the_field_names():
  spec = tasks.get("listops")
  with pytest.raises(dataclasses.FrozenInstanceError):
    spec.max_length = 10  # type: ignore[misc]
  assert [f.name for f in dataclasses.fields(recipes.ModelSize)] == [
      "emb_dim", "num_heads", "qkv_dim", "mlp_dim", "num_layers"]
  for name in tasks.names():
    spec, recipe = tasks.get(name), recipes.get(name)
    config = lra.make_config(name, "softmax")
    assert config.task == name
    assert config.model.max_length == (recipe.lra_baseline_max_length or spec.max_length)
    assert config.num_train_steps == recipe.recipe.num_train_steps
    assert set(recipe.variants) <= set(lra.task_variants(name))
    assert "tiny" in recipe.variants, name
    assert spec.shown in tasks.SHOWN and spec.find and spec.prepare and spec.check


def test_unknown_task_is_one_line_naming_the_field_and_the_tasks():
  message = "task='listop' is not a task; known: agnews, image, listops, pathfinder, pathx"
  for call in (lambda: tasks.get("listop"), lambda: lra.make_config("listop", "simple"),
               lambda: lra.task_variants("listop")):
    with pytest.raises(ValueError, match=re.escape(message)) as info:
      call()
    assert "\n" not in str(info.value)
  config = lra.make_config("listops", "simple", "tiny")
  config.task = "listop"
  with pytest.raises(ValueError, match=re.escape(message)):
    run_config.RunConfig.from_config_dict(config, n_devices=1)
  with pytest.raises(ValueError, match=re.escape(message)):
    tasks.data_config(config)
  with pytest.raises(tpu_aot.TpuCheckError, match=re.escape(message)):
    tpu_aot.task_sizes(config)


def test_consumers_read_the_record():
  for name in tasks.names():
    spec = tasks.get(name)
    if spec.vocab_size is None:
      with pytest.raises(tpu_aot.TpuCheckError, match="vocabulary"):
        tpu_aot.task_sizes(lra.make_config(name, "softmax"))
    else:
      assert tpu_aot.task_sizes(lra.make_config(name, "softmax")) == (
          spec.vocab_size, spec.num_classes, spec.dual)
    cells = {e.attention: e.accuracy for e in published.PUBLISHED if e.task == name}
    assert len(cells) == (0 if not spec.lra else 14 if name in ("listops", "text", "retrieval")
                          else 11), name
  assert published.lookup("softmax", "listops").accuracy == 36.37
  assert published.lookup("simple_resl", "retrieval").accuracy == 73.59
  assert published.lookup("performer", "pathx").accuracy is None
  assert tasks.shown_as("pixels") == ("image", "pathfinder", "pathx")
  assert tasks.shown_as("bytes") == ("text", "retrieval")
  with pytest.raises(ValueError, match="no self-pretraining recipe; known: "
                                       r"\['listops', 'text', 'image', 'pathfinder', 'pathx'\]"):
    pretraining.apply_paper_recipe(lra.make_config("retrieval", "softmax"), "spt")


TOY_FILE = "toy.npz"


def _toy_folder(data):
  return os.path.join(data.cache, "toy", f"seed{data.seed}")


def _toy_make(data):
  """Draws the toy data from ``data.seed`` into the cache, with a manifest."""
  rng = np.random.default_rng(data.seed)
  arrays = {}
  for split, n in (("train", 64), ("val", 16), ("test", 16)):
    lengths = rng.integers(2, data.max_length, n)
    arrays[f"{split}_tokens"] = np.concatenate([rng.integers(1, 7, k) for k in lengths])
    arrays[f"{split}_lengths"], arrays[f"{split}_labels"] = lengths, rng.integers(0, 3, n)
  folder = _toy_folder(data)
  os.makedirs(folder, exist_ok=True)
  np.savez(os.path.join(folder, TOY_FILE), **arrays)
  sources.write_manifest(folder, "toy", [os.path.join(folder, TOY_FILE)], None)
  return folder


def _toy_read(folder):
  with np.load(os.path.join(folder, TOY_FILE)) as z:
    return {s: RaggedExamples.from_sequences(
        np.split(z[f"{s}_tokens"], np.cumsum(z[f"{s}_lengths"])[:-1]), z[f"{s}_labels"])
            for s in sources.SPLITS}


def _toy_reader(data):
  found = _toy_find(data)
  folder = found.path if found.ready else _toy_make(data)
  return tasks.TaskData(**_toy_read(folder), vocab_size=7, num_classes=3, source=folder)


def _toy_find(data):
  folder = _toy_folder(data)
  ready = os.path.isfile(os.path.join(folder, TOY_FILE))
  return sources.Where("toy", "generated", folder, ready, "drawn from data.seed")


def _toy_prepare(data, source, dest, num_workers, log):
  del source, dest, num_workers, log
  _toy_make(data)
  return _toy_find(data)


def _toy_check(data, found):
  del data
  labels = {split: examples.labels for split, examples in _toy_read(found.path).items()}
  return sources.split_checks("toy", labels, 3, {"train": 64, "val": 16, "test": 16})


@pytest.fixture
def toy_task():
  spec = tasks.register(tasks.TaskSpec(
      name="toy", reader=_toy_reader, vocab_size=7, num_classes=3, max_length=32,
      find=_toy_find, prepare=_toy_prepare, check=_toy_check, lra=False,
      data_options={"flavour": "plain", "vocab_path": str}))
  recipes.register(recipes.TaskRecipe(
      task="toy", model=recipes.ModelSize(emb_dim=16, num_heads=2, qkv_dim=16, mlp_dim=32,
                                          num_layers=1),
      recipe=recipes.Recipe(batch_size=8, num_train_steps=10), source="this test",
      variants={"tiny": recipes.Variant(model={"emb_dim": 8, "qkv_dim": 8}, max_length=16)}))
  yield spec
  del tasks.REGISTRY["toy"], recipes.REGISTRY["toy"]


def test_a_new_task_is_one_record_and_one_reader(toy_task, tmp_path):
  with pytest.raises(ValueError, match="already registered"):
    tasks.register(toy_task)
  with pytest.raises(ValueError, match="task='nope' is not a task"):
    recipes.register(dataclasses.replace(recipes.get("toy"), task="nope"))
  config = lra.make_config("toy", "simple", "tiny")
  config.data.cache_dir = str(tmp_path)
  assert (config.model.emb_dim, config.model.qkv_dim, config.model.max_length) == (8, 8, 16)
  assert (config.batch_size, config.num_train_steps, config.data.flavour) == (8, 10, "plain")
  assert config.data.vocab_path is None
  config.data.vocab_path = "/somewhere"           # an unset field that takes a string
  assert lra.task_variants("toy") == ("tiny",)    # no LRA, SimpleTRON or SPT variants
  run = run_config.RunConfig.from_config_dict(config, n_devices=1)
  assert (run.data.flavour, run.data.vocab_path) == ("plain", "/somewhere")
  data = tasks.load_task(run.data)
  assert (data.vocab_size, data.num_classes, len(data.train)) == (7, 3, 64)
  assert tpu_aot.task_sizes(config) == (7, 3, False)


def test_a_new_task_is_in_the_data_command(toy_task, tmp_path, capsys):
  """where, prepare and verify run the toy record's functions, with no other change."""
  del toy_task
  spec = tmp_path / "toy_config.py"
  spec.write_text("from configs import lra\n\n\ndef get_config(variant=None):\n"
                  "  return lra.make_config('toy', 'simple', variant)\n")
  flags = ["--config", f"{spec}:tiny", f"--config.data.cache_dir={tmp_path / 'cache'}"]
  folder = os.path.join(tmp_path, "cache", "toy", "seed0")
  assert data_cli.main(["where", "--task", "toy", *flags]) == 0
  assert capsys.readouterr().out == (f"toy: not generated yet (in {folder}; drawn from "
                                     "data.seed)\n")
  assert data_cli.main(["verify", "toy", *flags]) == 1
  assert capsys.readouterr().out.startswith("FAIL: toy: not generated yet")
  assert data_cli.main(["prepare", "toy", *flags]) == 0
  assert capsys.readouterr().out == f"toy: generated {folder} (drawn from data.seed)\n"
  assert data_cli.main(["verify", "--task", "toy", *flags]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[1] == (f"ok: {folder}/{TOY_FILE}: "
                      f"{os.path.getsize(os.path.join(folder, TOY_FILE))} bytes, SHA-256 as made")
  assert "ok: toy train: 64 examples, as published" in lines
  # The data the reader trains on is the data prepare made.
  config = prepare.task_config("toy", f"{spec}:tiny", flags[2:])
  assert len(tasks.load_task(config).val) == 16
