"""The task registry (simpletron_jax/data/tasks.py, docs/tasks.md): one record per task, read by the
configs, the data, tpu_aot, pretraining, published and the config checks."""

import dataclasses
import glob
import os
import re

import numpy as np
import pytest

from configs import lra
from simpletron_jax.data import tasks
from simpletron_jax.data.common import RaggedExamples
from simpletron_jax.tools import published, tpu_aot
from simpletron_jax.train import config_checks, pretraining
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
  assert [f.name for f in dataclasses.fields(tasks.ModelSize)] == [
      "emb_dim", "num_heads", "qkv_dim", "mlp_dim", "num_layers"]
  for name in tasks.names():
    spec = tasks.get(name)
    config = lra.make_config(name, "softmax")
    assert config.task == name
    assert config.model.max_length == (spec.lra_baseline_max_length or spec.max_length)
    assert config.num_train_steps == spec.recipe.num_train_steps
    assert set(spec.variants) <= set(lra.task_variants(name))
    assert "tiny" in spec.variants, name


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
    config_checks.validate_config(config, n_devices=1)
  with pytest.raises(ValueError, match=re.escape(message)):
    tasks.load_task(config)
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
    assert cells == dict(spec.published)
  with pytest.raises(ValueError, match="no self-pretraining recipe; known: "
                                       r"\['listops', 'text', 'image', 'pathfinder', 'pathx'\]"):
    pretraining.apply_paper_recipe(lra.make_config("retrieval", "softmax"), "spt")


def _toy_reader(config):
  rng = np.random.default_rng(int(config.data.seed))
  def split(n):
    lengths = rng.integers(2, config.model.max_length, n)
    tokens = [rng.integers(1, 7, length) for length in lengths]
    return RaggedExamples.from_sequences(tokens, rng.integers(0, 3, n))
  return tasks.TaskData(train=split(64), val=split(16), test=split(16), vocab_size=7,
                        num_classes=3, source="toy")


@pytest.fixture
def toy_task():
  spec = tasks.register(tasks.TaskSpec(
      name="toy", reader=_toy_reader, vocab_size=7, num_classes=3, max_length=32,
      model=tasks.ModelSize(emb_dim=16, num_heads=2, qkv_dim=16, mlp_dim=32, num_layers=1),
      recipe=tasks.Recipe(batch_size=8, num_train_steps=10), source="this test",
      lra=False, data_options={"flavour": "plain", "vocab_path": str},
      variants={"tiny": tasks.Variant(model={"emb_dim": 8, "qkv_dim": 8}, max_length=16)}))
  yield spec
  del tasks.REGISTRY["toy"]


def test_a_new_task_is_one_record_and_one_reader(toy_task):
  with pytest.raises(ValueError, match="already registered"):
    tasks.register(toy_task)
  config = lra.make_config("toy", "simple", "tiny")
  assert (config.model.emb_dim, config.model.qkv_dim, config.model.max_length) == (8, 8, 16)
  assert (config.batch_size, config.num_train_steps, config.data.flavour) == (8, 10, "plain")
  assert config.data.vocab_path is None
  config.data.vocab_path = "/somewhere"           # an unset field that takes a string
  assert lra.task_variants("toy") == ("tiny",)    # no LRA, SimpleTRON or SPT variants
  config_checks.validate_config(config, n_devices=1)
  data = tasks.load_task(config)
  assert (data.vocab_size, data.num_classes, len(data.train)) == (7, 3, 64)
  assert tpu_aot.task_sizes(config) == (7, 3, False)
