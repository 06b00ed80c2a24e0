"""Every config file builds, for every variant, and validates."""

import glob
import importlib.util
import os

import pytest

from simpletron_jax import models, train_lib
from tests.conftest import ROOT

CONFIG_FILES = sorted(f for f in glob.glob(os.path.join(ROOT, "configs", "*", "*.py"))
                      if os.path.basename(f) not in ("__init__.py", "base.py"))


def _load(path):
  spec = importlib.util.spec_from_file_location("cfg", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: os.path.relpath(p, ROOT))
@pytest.mark.parametrize("variant", [None, "tiny", "tiny_short"])
def test_config_builds_and_validates(path, variant):
  config = _load(path).get_config(variant)
  train_lib.validate_config(config, n_devices=2)
  model = models.build_classifier(config.model, vocab_size=16, num_classes=10)
  assert model.encoder.attention == config.model.attention
  if variant:
    assert config.model.emb_dim == 64 and config.model.num_layers == 2


def test_paper_and_lra_settings():
  lra = _load(os.path.join(ROOT, "configs/listops/transformer.py")).get_config()
  paper = _load(os.path.join(ROOT, "configs/listops/simple_res.py")).get_config()
  assert (lra.learning_rate, lra.warmup, lra.num_train_steps, lra.adam_b2) == (0.05, 1000, 5000, 0.98)
  assert (lra.model.num_layers, lra.model.emb_dim, lra.model.mlp_dim) == (4, 512, 1024)
  assert (paper.learning_rate, paper.num_train_steps, paper.adam_b2) == (0.005, 15000, 0.999)
  assert (paper.model.num_layers, paper.model.mlp_dim, paper.model.learn_pos_emb) == (6, 2048, True)


def test_data_seed_follows_config_seed():
  config = _load(os.path.join(ROOT, "configs/listops/simple.py")).get_config("tiny")
  config.seed = 7
  assert config.data.seed == 7


def test_unknown_variant():
  with pytest.raises(ValueError, match="unknown config variant 'huge'"):
    _load(os.path.join(ROOT, "configs/listops/simple.py")).get_config("huge")
