"""Weight surgery, freezing, per-layer attention and LoRA (issue 12)."""

import re

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simpletron_jax.data.common import make_batch
from simpletron_jax.model import encoders, lora, transfer
from simpletron_jax.model.attention.linear import LinearAttention
from simpletron_jax.model.attention.simple import SimpleAttention
from simpletron_jax.model.attention.softmax import SoftmaxAttention
from simpletron_jax.train import run_config, steps, train_state
from tests.test_train import tiny_config


def _model_and_params(config, task, seed=0):
  run = run_config.RunConfig.from_config_dict(config)
  model = train_state.build_model(run, task)
  state = train_state.create_train_state(run.train, model, jax.random.PRNGKey(seed),
                                         config.model.max_length)
  return model, state.params


def _tokens(task, n=4):
  batch = make_batch(task.train, np.arange(n), max_length=40, bucket=8)
  return jnp.asarray(batch["inputs"]), jnp.asarray(batch["mask"])


@pytest.mark.slow
def test_simple_to_softmax_surgery_keeps_qkv_projections(presence_task):
  simple_cfg = tiny_config("simple")
  soft_cfg = tiny_config("softmax")
  _, simple_params = _model_and_params(simple_cfg, presence_task, seed=1)
  soft_model, soft_params = _model_and_params(soft_cfg, presence_task, seed=2)
  moved, report = transfer.transfer_params(simple_params, soft_params)
  # Simple has no output projection: softmax's stays new; nothing of Simple is dropped.
  assert report.dropped == []
  assert sorted(report.new) == sorted(
      f"encoder/encoderblock_{i}/attention/out/kernel" for i in range(2))   # LRA: no biases
  x_BxLxE = jax.random.normal(jax.random.PRNGKey(0), (3, 7, 16))
  for i in range(2):
    for name in ("query", "key", "value"):
      dense = nn.DenseGeneral(features=(2, 8), use_bias=False)
      q_src = dense.apply({"params": simple_params["encoder"][f"encoderblock_{i}"]
                           ["attention"][name]}, x_BxLxE)
      q_dst = dense.apply({"params": moved["encoder"][f"encoderblock_{i}"]
                           ["attention"][name]}, x_BxLxE)
      chex.assert_shape(q_dst, (3, 7, 2, 8))
      np.testing.assert_array_equal(np.asarray(q_src), np.asarray(q_dst))
  # The moved tree runs in the softmax model, and moving it back restores Simple exactly.
  tokens, mask = _tokens(presence_task)
  chex.assert_shape(soft_model.apply({"params": moved}, tokens, mask), (4, 2))
  back, back_report = transfer.transfer_params(moved, simple_params)
  chex.assert_trees_all_equal(back, jax.device_get(simple_params))
  assert len(back_report.dropped) == 2


def test_surgery_errors_name_mismatching_paths(presence_task):
  _, small = _model_and_params(tiny_config("softmax"), presence_task)
  _, wide = _model_and_params(tiny_config("softmax", **{"model.mlp_dim": 48}), presence_task)
  with pytest.raises(ValueError, match=r"encoderblock_0/MlpBlock_0/Dense_0/kernel: source "
                     r"\(16, 32\) vs target \(16, 48\)"):
    transfer.transfer_params(small, wide)
  moved, report = transfer.transfer_params(small, wide, include=("attention/",))
  # q, k, v and out kernels of 2 blocks (no attention biases, as LRA)
  assert all("attention/" in p for p in report.copied) and len(report.copied) == 8
  with pytest.raises(ValueError, match="init_include pattern 'nope'"):
    transfer.transfer_params(small, wide, include=("nope",))
  with pytest.raises(ValueError, match="freeze pattern 'nope' matches no parameter"):
    transfer.freeze_labels(small, ("nope",))


@pytest.mark.slow
@pytest.mark.parametrize("freeze,lora_rank", [(("attention/(query|key|value)/",), 0), ((), 4)])
def test_frozen_parameters_stay_bit_identical(presence_task, freeze, lora_rank):
  config = tiny_config("softmax", freeze=freeze, **{"lora.rank": lora_rank})
  run = run_config.RunConfig.from_config_dict(config)
  model = train_state.build_model(run, presence_task)
  state = train_state.create_train_state(run.train, model, jax.random.PRNGKey(0),
                                         config.model.max_length)
  before = transfer.flatten(jax.device_get(state.params))
  p_train, _ = steps.pmap_steps(state.apply_fn)
  state_repl = steps.replicate(state)
  for step in range(3):
    batch = make_batch(presence_task.train, np.arange(16 * step, 16 * step + 16),
                       max_length=40, bucket=8)
    state_repl, _ = p_train(state_repl, steps.shard(batch, 2), jax.random.PRNGKey(step))
  after = transfer.flatten(jax.device_get(steps.unreplicate(state_repl).params))
  assert sorted(after) == sorted(before)
  if lora_rank:  # the base tree; the 8 adapted kernels' A and B train
    frozen = [p for p in before if p.startswith("base/")]
    assert len(frozen) == len(before) - 16
  else:  # q/k/v kernels of 2 blocks (no attention biases, as LRA)
    frozen = [p for p in before if re.search("attention/(query|key|value)/", p)]
    assert len(frozen) == 6
  for path, value in before.items():
    if path in frozen:
      np.testing.assert_array_equal(value, after[path], err_msg=path)
    else:
      assert not np.array_equal(value, after[path]), f"{path} did not train"


def test_attention_per_layer_builds_those_modules(presence_task):
  config = tiny_config("softmax", **{"model.num_layers": 3,
                                     "model.attention_per_layer": ("simple", "linear", "softmax")})
  model = train_state.build_model(run_config.RunConfig.from_config_dict(config),
                                  presence_task)
  tokens, mask = _tokens(presence_task)
  paths = model.module_paths(jax.random.PRNGKey(0), tokens, mask)
  kinds = {i: type(paths[f"encoder/encoderblock_{i}/attention"]) for i in range(3)}
  assert kinds == {0: SimpleAttention, 1: LinearAttention, 2: SoftmaxAttention}
  # A list that names one attention throughout is the same model as model.attention.
  same = tiny_config("softmax", **{"model.attention_per_layer": ("linear", "linear")})
  plain = tiny_config("linear")
  m_same, params = _model_and_params(same, presence_task)
  m_plain = train_state.build_model(run_config.RunConfig.from_config_dict(plain),
                                    presence_task)
  np.testing.assert_array_equal(m_same.apply({"params": params}, tokens, mask),
                                m_plain.apply({"params": params}, tokens, mask))


def test_attention_per_layer_errors():
  config = tiny_config("softmax")
  config.model.attention_per_layer = ("linear",)
  with pytest.raises(ValueError, match=r"attention_per_layer has 1 names .*num_layers=2"):
    encoders.ModelConfig.from_config_dict(config.model)
  config.model.attention_per_layer = ("linear", "nope")
  with pytest.raises(ValueError, match=r"attention_per_layer\[1\]: unknown attention 'nope'"):
    encoders.ModelConfig.from_config_dict(config.model)
  config.model.qkv_dim = 8
  config.model.attention_per_layer = ("softmax", "simple")
  with pytest.raises(ValueError, match="'simple' has no output projection"):
    encoders.ModelConfig.from_config_dict(config.model)


def test_lora_zero_b_is_the_base_model_and_merge_is_w_plus_scaled_ab(presence_task):
  model, params = _model_and_params(tiny_config("softmax"), presence_task)
  targets = ("attention/(query|key|value|out)/kernel$",)
  wrapped = lora.wrap(params, targets, rank=4, rng=jax.random.PRNGKey(5))
  assert len(lora.target_paths(params, targets)) == 8
  tokens, mask = _tokens(presence_task)
  base_out = model.apply({"params": params}, tokens, mask)
  np.testing.assert_array_equal(
      lora.wrap_apply(model.apply, 2.0)({"params": wrapped}, tokens, mask), base_out)
  # Non-zero B: the merged out kernel [H, K, E] is W + scale * (A @ B) reshaped (numpy).
  adapters = wrapped["lora"]["encoder"]["encoderblock_1"]["attention"]["out"]["kernel"]
  adapters["b"] = jax.random.normal(jax.random.PRNGKey(6), adapters["b"].shape)
  chex.assert_shape([adapters["a"], adapters["b"]], [(16, 4), (4, 16)])
  merged = lora.merge(wrapped, 0.5)
  w = np.asarray(params["encoder"]["encoderblock_1"]["attention"]["out"]["kernel"])
  expected = w + 0.5 * (np.asarray(adapters["a"]) @ np.asarray(adapters["b"])).reshape(w.shape)
  np.testing.assert_allclose(merged["encoder"]["encoderblock_1"]["attention"]["out"]["kernel"],
                             expected, rtol=1e-6, atol=1e-6)
  assert not np.allclose(lora.wrap_apply(model.apply, 0.5)({"params": wrapped}, tokens, mask),
                         base_out)
  with pytest.raises(ValueError, match="lora.targets pattern 'nope'"):
    lora.wrap(params, ("nope",), 4, jax.random.PRNGKey(0))
