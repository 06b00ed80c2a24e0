"""Encoder: shapes, padding invariance of the logits, config validation, positions."""

import re

import chex
import flax.linen
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.listops import simple as simple_config
from simpletron_jax import attention, layers, models


def _model_config(name, pool="CLS", learned=False):
  config = simple_config.get_config("tiny")
  config.model.attention = name
  config.model.emb_dim = config.model.qkv_dim = 16
  config.model.mlp_dim = 32
  config.model.max_length = 40
  config.model.classifier_pool = pool
  config.model.learn_pos_emb = learned
  return config.model


# Every variant once; the pooling (CLS with learned positions, or MEAN with sinusoids)
# alternates along the list, so each pooling is checked on half the variants. Attention-level
# padding invariance of every variant, at every position, is in test_attention.py.
@pytest.mark.parametrize("name,pool,learned", [
    (name, *(("CLS", True), ("MEAN", False))[i % 2]) for i, name in enumerate(attention.names())])
def test_logits_shape_and_padding_invariance(name, pool, learned):
  model = models.build_classifier(_model_config(name, pool, learned), vocab_size=16,
                                  num_classes=10)
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, 16, (3, 20)).astype(np.int32)
  tokens[1, 13:] = 0  # a shorter example inside the batch
  params = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.asarray(tokens))
  apply = jax.jit(model.apply)  # one compile per shape; eager flax compiles every operation
  logits = apply(params, jnp.asarray(tokens))
  chex.assert_shape(logits, (3, 10))
  chex.assert_type(logits, jnp.float32)
  padded = np.pad(tokens, ((0, 0), (0, 17)))
  logits_padded = apply(params, jnp.asarray(padded))
  np.testing.assert_allclose(np.asarray(logits_padded), np.asarray(logits), rtol=1e-5, atol=1e-5)


def test_explicit_mask_keeps_zero_tokens():
  model = models.build_classifier(_model_config("simple", "MEAN"), vocab_size=16, num_classes=2)
  tokens = jnp.array([[0, 5, 0, 7]], jnp.int32)
  params = model.init(jax.random.PRNGKey(0), tokens)
  implicit = model.apply(params, tokens)
  explicit = model.apply(params, tokens, jnp.ones((1, 4), bool))
  assert not np.allclose(np.asarray(implicit), np.asarray(explicit))


def test_sinusoidal_table_matches_formula():
  table = layers.sinusoidal_table(50, 8)
  pos, i = 7, 3
  np.testing.assert_allclose(table[pos, 2 * i], np.sin(pos / 10000 ** (2 * i / 8)), rtol=1e-6)
  np.testing.assert_allclose(table[pos, 2 * i + 1], np.cos(pos / 10000 ** (2 * i / 8)), rtol=1e-6)


@pytest.mark.parametrize("field,value,message", [
    ("attention", "nope", "unknown attention 'nope'"),
    ("qkv_dim", 24, r"qkv_dim \(24\) must equal model.emb_dim \(16\)"),
    ("num_heads", 3, "not divisible by model.num_heads=3"),
    ("classifier_pool", "MAX", "model.classifier_pool='MAX'"),
    ("dtype", "float16", "model.dtype='float16'"),
    ("dropout_mask_bits", 8, r"model.dropout_mask_bits=8; expected one of \[32, 16\]"),
])
def test_config_errors_name_the_field(field, value, message):
  config = _model_config("simple")
  config[field] = value
  with pytest.raises(ValueError, match=message):
    models.build_classifier(config, vocab_size=16, num_classes=2)


def test_too_long_input_is_a_clear_error():
  model = models.build_classifier(_model_config("simple"), vocab_size=16, num_classes=2)
  with pytest.raises(ValueError, match="exceeds max_len=41"):
    model.init(jax.random.PRNGKey(0), jnp.ones((1, 45), jnp.int32))


def test_bfloat16_activations_run():
  config = _model_config("softmax")
  config.dtype = "bfloat16"
  model = models.build_classifier(config, vocab_size=16, num_classes=2)
  tokens = jnp.ones((2, 10), jnp.int32)
  logits = model.apply(model.init(jax.random.PRNGKey(0), tokens), tokens)
  chex.assert_type(logits, jnp.float32)
  chex.assert_tree_all_finite(logits)


def test_packed_dropout_keeps_the_realised_fraction_unbiased_and_independent():
  x = jnp.ones((64, 1001), jnp.bfloat16)   # odd width: the last word is cut
  keep = layers.realised_keep_prob(0.1)
  assert abs(keep - 0.9) <= 2.0 ** -17

  def drop(key, deterministic=False):
    return layers.PackedDropout(0.1).apply({}, x, deterministic=deterministic,
                                           rngs={"dropout": key})

  y = drop(jax.random.PRNGKey(0))
  chex.assert_shape(y, x.shape)
  chex.assert_type(y, jnp.bfloat16)
  kept = np.asarray(y != 0)
  assert set(np.unique(np.asarray(y, np.float32))) == {0.0, float(jnp.bfloat16(1 / keep))}
  sigma = np.sqrt(keep * (1 - keep) / kept.size)
  assert abs(kept.mean() - keep) < 5 * sigma
  # Neighbours share a random word; their decisions must still be independent.
  lanes = kept[:, :1000].reshape(-1, 2).astype(np.float64)
  assert abs(np.corrcoef(lanes[:, 0], lanes[:, 1])[0, 1]) < 5 / np.sqrt(len(lanes))
  np.testing.assert_array_equal(np.asarray(drop(jax.random.PRNGKey(0))), np.asarray(y))
  assert (np.asarray(drop(jax.random.PRNGKey(1)) != 0) != kept).mean() > 0.1
  np.testing.assert_array_equal(np.asarray(drop(jax.random.PRNGKey(0), True)), np.asarray(x))


def test_dropout_mask_bits_reaches_every_encoder_dropout_and_not_eval():
  config16 = _model_config("simple")
  config16.dropout_mask_bits = 16
  model16 = models.build_classifier(config16, vocab_size=16, num_classes=2)
  model32 = models.build_classifier(_model_config("simple"), vocab_size=16, num_classes=2)
  tokens = jnp.ones((3, 20), jnp.int32)
  params = model32.init(jax.random.PRNGKey(0), tokens)
  train = lambda model: (lambda p: model.apply(p, tokens, deterministic=False,
                                               rngs={"dropout": jax.random.PRNGKey(1)}))
  draws = re.findall(r"random_bits\[bit_width=32 shape=\(([\d, ]+)\)\]",
                     str(jax.make_jaxpr(train(model16))(params)))
  # Embedding dropout, then per block the attention branch and the two MLP dropouts, each
  # drawing one 32-bit word per two elements (emb 16 -> 8 words, mlp 32 -> 16).
  assert draws == ["3, 21, 8"] + ["3, 21, 8", "3, 21, 16", "3, 21, 8"] * config16.num_layers
  np.testing.assert_array_equal(np.asarray(model16.apply(params, tokens)),
                                np.asarray(model32.apply(params, tokens)))
  assert not np.allclose(np.asarray(train(model16)(params)), np.asarray(train(model32)(params)))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gelu_matches_flax_bit_for_bit_with_its_own_gradient(dtype):
  # layers.gelu recomputes tanh in the backward pass instead of saving it: same numbers.
  x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 50)) * 3, dtype)
  weights = jnp.asarray(np.random.default_rng(1).normal(size=(3, 50)), dtype)

  def value_and_grad(fn):
    loss = lambda t: jnp.sum((fn(t) * weights).astype(jnp.float32))  # noqa: E731
    return jax.jit(jax.value_and_grad(loss))(x), jax.jit(fn)(x)

  (loss, grad), y = value_and_grad(layers.gelu)
  (loss_ref, grad_ref), y_ref = value_and_grad(flax.linen.gelu)
  chex.assert_type([y, grad], dtype)
  np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(y_ref, np.float32))
  np.testing.assert_array_equal(np.asarray(grad, np.float32), np.asarray(grad_ref, np.float32))
  assert loss == loss_ref
