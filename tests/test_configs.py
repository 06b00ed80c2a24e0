"""Every config file builds, for every variant, and validates; spot checks of LRA and paper
settings (docs/configs.md)."""

import glob
import importlib.util
import os
import warnings

import jax
import jax.numpy as jnp
import pytest

from configs import lra
from simpletron_jax.data import tasks
from simpletron_jax.experiments import attentions
from simpletron_jax.model import attention, encoders
from simpletron_jax.runtime import errors
from simpletron_jax.train import run_config
from tests.conftest import ROOT

CONFIG_FILES = sorted(f for f in glob.glob(os.path.join(ROOT, "configs", "*", "*.py"))
                      if os.path.basename(f) != "__init__.py")
def _attention(path):
  name = os.path.basename(path)[:-3]
  return "softmax" if name == "transformer" else name


CASES = [(path, variant) for path in CONFIG_FILES
         for variant in (None,) + lra.variants(os.path.basename(os.path.dirname(path)),
                                               _attention(path))]


def _load(path):
  spec = importlib.util.spec_from_file_location("cfg", os.path.join(ROOT, path))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize("path,variant", CASES,
                         ids=[f"{os.path.relpath(p, ROOT)}:{v}" for p, v in CASES])
def test_config_builds_and_validates(path, variant):
  config = _load(path).get_config(variant)
  assert config.task == os.path.basename(os.path.dirname(path))
  with warnings.catch_warnings():   # a :tiny variant may keep its task's longer warmup
    warnings.filterwarnings("ignore", r"warmup=\d+ exceeds num_train_steps", errors.RunWarning)
    run_config.RunConfig.from_config_dict(config, n_devices=2)
  model = encoders.build_classifier(config.model, vocab_size=16, num_classes=10,
                                    dual=config.task == "retrieval")
  assert model.encoder.config.attention == config.model.attention
  kwargs = dict(config.model.attention_kwargs)
  if attentions.get(config.model.attention).follows_max_length:   # + 1 for a CLS token only
    with_cls = config.model.classifier_pool == "CLS" and not (
        config.task == "retrieval" and config.model.lra_dual_no_cls)
    assert kwargs["max_length"] == config.model.max_length + with_cls
  attention.get(config.model.attention).build(  # the kwargs are accepted by the module
      num_heads=config.model.num_heads, qkv_dim=config.model.qkv_dim,
      out_dim=config.model.emb_dim, dropout_rate=0.0, dtype=None, **kwargs)


def test_every_attention_has_a_config_for_every_task():
  names = {"transformer" if n == "softmax" else n for n in attention.names()}
  for task in tasks.lra_tasks():
    files = {os.path.basename(f)[:-3] for f in glob.glob(os.path.join(ROOT, "configs", task,
                                                                      "*.py"))}
    assert names <= files, (task, sorted(names - files))


def test_lra_and_paper_settings():
  get = lambda task, model, variant=None: _load(f"configs/{task}/{model}.py").get_config(variant)
  listops = get("listops", "transformer")
  assert (listops.learning_rate, listops.warmup, listops.num_train_steps,
          listops.adam_b2) == (0.05, 1000, 5000, 0.98)
  assert (listops.model.num_layers, listops.model.emb_dim, listops.model.mlp_dim) == (4, 512, 1024)
  paper = get("listops", "simple_res")
  assert (paper.learning_rate, paper.num_train_steps, paper.adam_b2) == (0.005, 15000, 0.999)
  assert (paper.model.num_layers, paper.model.mlp_dim, paper.model.learn_pos_emb) == (6, 2048, True)
  text = get("text", "transformer")  # LRA's code: 1000 (the paper's 4000 for simple*)
  assert (text.model.max_length, text.warmup, text.num_train_steps) == (1000, 8000, 20000)
  assert get("text", "simple").model.max_length == 4000
  assert (text.model.emb_dim, text.model.num_heads, text.model.mlp_dim) == (256, 4, 1024)
  matching = get("retrieval", "simple")
  assert (matching.num_train_steps, matching.model.emb_dim, matching.model.learn_pos_emb) == (
      15000, 128, True)
  image = get("image", "transformer")
  assert (image.batch_size, image.warmup, image.num_train_steps, image.weight_decay) == (
      256, 175, 35000, 0.0)
  assert (image.model.num_heads, image.model.qkv_dim, image.model.dropout_rate) == (8, 64, 0.3)
  assert get("image", "simple").model.qkv_dim == 128  # no output projection: qkv = emb
  path32 = get("pathfinder", "transformer")
  assert (path32.batch_size, path32.warmup, path32.num_train_steps) == (512, 312, 62400)
  assert (path32.model.classifier_pool, path32.model.num_layers) == ("MEAN", 4)
  pathx = get("pathx", "transformer")
  assert (pathx.model.max_length, pathx.grad_clip_norm, pathx.warmup) == (16384, 1.0, 2500)


def test_data_seed_and_length_sized_kwargs_follow_overrides():
  config = _load("configs/listops/simple.py").get_config("tiny")
  config.seed = 7
  assert config.data.seed == 7
  config = _load("configs/text/linformer.py").get_config()
  config.model.max_length = 1000  # LRA's code value for text
  assert dict(config.model.attention_kwargs)["max_length"] == 1001


def test_unknown_variant():
  with pytest.raises(ValueError, match="unknown config variant 'huge'"):
    _load("configs/listops/simple.py").get_config("huge")
  with pytest.raises(ValueError, match="'tiny_lra' for task 'text'"):
    _load("configs/text/simple.py").get_config("tiny_lra")
  with pytest.raises(ValueError, match="'authors' is the SimpleTRON authors' function"):
    _load("configs/listops/linear.py").get_config("authors")
  with pytest.raises(ValueError, match="'tiny_authors' for task 'image'"):
    _load("configs/image/simple.py").get_config("tiny_authors")


def test_switched_attention_drops_the_old_defaults_with_a_warning_and_refuses_the_rest():
  """A config made for ``simple`` and switched to ``softmax`` (``--config.model.attention``)
  keeps Simple's options at their defaults: the checks name them in one warning and the
  model is built without them; one set away from its default is refused, naming the field."""
  config = lra.make_config("listops", "simple", variant="tiny")
  assert not attention.inherited_options("simple", config.model.attention_kwargs)
  config.model.attention = "softmax"
  dropped = attention.inherited_options("softmax", config.model.attention_kwargs)
  assert dropped and "block_diagonal" in dropped
  with pytest.warns(errors.RunWarning, match=r"model\.attention_kwargs .*'block_diagonal'"):
    run_config.RunConfig.from_config_dict(config, n_devices=2)
  model = encoders.build_classifier(config.model, vocab_size=16, num_classes=10)
  assert model.encoder.config.attention == "softmax"
  config.model.attention_kwargs.block_diagonal = True
  with pytest.raises(ValueError, match=r"model\.attention_kwargs has \['block_diagonal'\]"):
    encoders.build_classifier(config.model, vocab_size=16, num_classes=10).init(
        jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32))
