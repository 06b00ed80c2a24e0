"""A new attention is one file (docs/configs.md): a toy variant, written and registered here as
a file of ``simpletron_jax/model/attention/`` registers its own, with its experiments record
(:mod:`simpletron_jax.experiments.attentions`), gets its options and facts into the configs
and trains through ``trainer.train_and_evaluate``."""

import json
import math
import os

import flax.linen as nn
import jax.numpy as jnp
import pytest

from configs import lra
from simpletron_jax.experiments import attentions
from simpletron_jax.model import attention
from simpletron_jax.model.attention import base
from simpletron_jax.train import run_config, trainer


class ToyAttention(base.Attention):
  """Every position gets its example's mean of the real values, per head, times a learned
  gate: ``y_i = out(g * mean_{j real} v_j)``.

  Fields: :class:`base.Attention`'s ``num_heads`` (H), ``qkv_dim`` (D), ``out_dim`` (O),
  ``use_bias`` and ``dense_init`` (of the ``value`` and ``out`` projections), then
  ``dropout_rate`` (on the means), ``dtype`` and its own options:

  Attributes:
    first_global: an option the configs set from the pooling (``AttentionRecipe.cls_option``);
      it changes nothing here.

  Parameters besides ``value``/``out``: ``gate`` ``[H]``, ones.

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``.
  """

  first_global: bool = False

  @nn.compact
  def __call__(self, x_BxLxE, mask_BxL=None, *, deterministic: bool = True):
    real_BxLx1x1 = base.default_mask(x_BxLxE, mask_BxL)[:, :, None, None].astype(self.dtype)
    v_BxLxHxK = self.project_heads(x_BxLxE, "value")
    mean_Bx1xHxK = ((v_BxLxHxK * real_BxLx1x1).sum(1, keepdims=True)
                    / jnp.maximum(real_BxLx1x1.sum(1, keepdims=True), 1))
    gate_H = self.param("gate", nn.initializers.ones, (self.num_heads,), jnp.float32)
    y_Bx1xHxK = nn.Dropout(self.dropout_rate)(mean_Bx1xHxK * gate_H[:, None].astype(self.dtype),
                                              deterministic=deterministic)
    return self.project_out(jnp.broadcast_to(y_Bx1xHxK, v_BxLxHxK.shape))


@pytest.fixture
def toy_attention():
  spec = attention.register(attention.AttentionSpec(
      "toy_mean", ToyAttention, paper="this test", length_padding_exact=True,
      output_projection=False))
  attentions.register("toy_mean", attentions.AttentionRecipe(cls_option="first_global"))
  yield spec
  del attention.REGISTRY["toy_mean"], attentions.REGISTRY["toy_mean"]


def test_only_a_base_attention_registers():
  with pytest.raises(ValueError, match="must subclass .*base.Attention"):
    attention.register(attention.AttentionSpec("dense", nn.Dense))
  assert "dense" not in attention.names()


def test_an_experiments_record_names_a_registered_attention_and_its_options():
  with pytest.raises(ValueError, match="unknown attention 'nope'"):
    attentions.register("nope", attentions.AttentionRecipe())
  with pytest.raises(ValueError, match="already has an experiments record"):
    attentions.register("softmax", attentions.AttentionRecipe())
  with pytest.raises(ValueError, match="cls_option='first_global' is not one of its options"):
    attentions.register("aft_simple", attentions.AttentionRecipe(cls_option="first_global"))
  with pytest.raises(ValueError, match="explain_method='x'"):
    attentions.register("aft_simple", attentions.AttentionRecipe(explain_method="x"))
  assert "aft_simple" not in attentions.REGISTRY
  assert attentions.get("aft_simple") == attentions.AttentionRecipe()   # no facts: defaults
  assert set(attentions.REGISTRY) <= set(attention.names())


@pytest.mark.slow   # compiles a train and an eval step: about 12 s of CPU
def test_a_new_attention_is_one_module_and_one_register_call(toy_attention, presence_task,
                                                           tmp_path):
  with pytest.raises(ValueError, match="already registered"):
    attention.register(toy_attention)
  assert toy_attention.options() == {"first_global": False}
  # Its configs read its registry facts: the option that follows the pooling (ListOps pools
  # CLS, Pathfinder MEAN), qkv_dim = emb_dim without an output projection (Pathfinder's
  # Transformer has 16 of 32); no :authors or :lra_code variants.
  pathfinder = lra.make_config("pathfinder", "toy_mean", "tiny")
  assert dict(pathfinder.model.attention_kwargs) == {"first_global": False}
  assert pathfinder.model.qkv_dim == pathfinder.model.emb_dim == 32
  assert lra.make_config("pathfinder", "softmax", "tiny").model.qkv_dim == 16
  config = lra.make_config("listops", "toy_mean", "tiny")
  assert dict(config.model.attention_kwargs) == {"first_global": True}
  assert "tiny" in lra.variants("listops", "toy_mean")
  assert not set(lra.variants("listops", "toy_mean")) & {"authors", "lra_code"}
  run_config.RunConfig.from_config_dict(config, n_devices=1)

  config.model.update(emb_dim=16, qkv_dim=16, mlp_dim=32, num_heads=2, num_layers=1,
                      max_length=40)
  config.update(num_train_steps=2, warmup=1, eval_frequency=2, checkpoint_every=2,
                log_every=1, batch_size=16, num_eval_steps=1, num_test_steps=1)
  config.data.bucket = 8
  workdir = str(tmp_path / "run")
  results = trainer.train_and_evaluate(config, workdir, data=presence_task)
  assert (results["attention"], results["final_step"]) == ("toy_mean", 2)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    losses = [r["loss"] for r in map(json.loads, f) if r.get("split") == "train"]
  assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
  with open(os.path.join(workdir, "parameter_overview.txt")) as f:
    overview = f.read()
  assert "attention/gate" in overview and "attention/value/kernel" in overview
  assert "attention/query" not in overview

