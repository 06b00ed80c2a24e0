"""Encoder: shapes, padding invariance of the logits, config validation, positions."""

import chex
import flax.linen
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.listops import simple as simple_config
from simpletron_jax.model import attention, encoders, layers
from tests.module_support import init_variables, jit_apply


def _model_config(name, pool="CLS", learned=False):
  config = simple_config.get_config("tiny")
  config.model.attention = name
  config.model.emb_dim = config.model.qkv_dim = 16
  config.model.mlp_dim = 32
  config.model.max_length = 40
  config.model.num_layers = 1   # every block runs the same code; one compiles in half the time
  config.model.classifier_pool = pool
  config.model.learn_pos_emb = learned
  return config.model


# Every variant once; the pooling (CLS with learned positions, or MEAN with sinusoids)
# alternates along the list, so each pooling is checked on half the variants. Attention-level
# padding invariance of every variant, at every position, is in test_attention.py.
@pytest.mark.parametrize("name,pool,learned", [
    (name, *(("CLS", True), ("MEAN", False))[i % 2]) for i, name in enumerate(attention.names())])
def test_logits_shape_and_padding_invariance(name, pool, learned):
  model = encoders.build_classifier(_model_config(name, pool, learned), vocab_size=16,
                                    num_classes=10)
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, 16, (3, 20)).astype(np.int32)
  tokens[1, 13:] = 0  # a shorter example inside the batch
  params = init_variables(model, jnp.asarray(tokens), seed=0)
  apply = jit_apply(model)  # one compile per shape; eager flax compiles every operation
  logits = apply(params, jnp.asarray(tokens))
  chex.assert_shape(logits, (3, 10))
  chex.assert_type(logits, jnp.float32)
  padded = np.pad(tokens, ((0, 0), (0, 17)))
  logits_padded = apply(params, jnp.asarray(padded))
  np.testing.assert_allclose(np.asarray(logits_padded), np.asarray(logits), rtol=1e-5, atol=1e-5)


def test_explicit_mask_keeps_zero_tokens():
  model = encoders.build_classifier(_model_config("simple", "MEAN"), vocab_size=16, num_classes=2)
  tokens = jnp.array([[0, 5, 0, 7]], jnp.int32)
  params = init_variables(model, tokens, seed=0)
  implicit = jit_apply(model)(params, tokens)
  explicit = jit_apply(model)(params, tokens, jnp.ones((1, 4), bool))
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
])
def test_config_errors_name_the_field(field, value, message):
  config = _model_config("simple")
  config[field] = value
  with pytest.raises(ValueError, match=message):
    encoders.build_classifier(config, vocab_size=16, num_classes=2)


def test_too_long_input_is_a_clear_error():
  model = encoders.build_classifier(_model_config("simple"), vocab_size=16, num_classes=2)
  with pytest.raises(ValueError, match="exceeds max_len=41"):
    model.init(jax.random.PRNGKey(0), jnp.ones((1, 45), jnp.int32))


def test_bfloat16_activations_run():
  config = _model_config("softmax")
  config.dtype = "bfloat16"
  model = encoders.build_classifier(config, vocab_size=16, num_classes=2)
  tokens = jnp.ones((2, 10), jnp.int32)
  params = init_variables(model, tokens, seed=0)
  logits = jit_apply(model)(params, tokens)
  chex.assert_type(logits, jnp.float32)
  chex.assert_tree_all_finite(logits)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gelu_matches_flax_bit_for_bit_with_its_own_gradient(dtype):
  # layers.gelu recomputes tanh in the backward pass instead of saving it: same numbers.
  x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 50)) * 3, dtype)
  weights = jnp.asarray(np.random.default_rng(1).normal(size=(3, 50)), dtype)

  # Two different programs compared bit for bit: compiled as train.py compiles them, with XLA's
  # default fusion emitters, which the suite's flags turn off (tests/conftest.py).
  options = {"xla_cpu_use_fusion_emitters": True}

  def value_and_grad(fn):
    loss = lambda t: jnp.sum((fn(t) * weights).astype(jnp.float32))  # noqa: E731
    compiled = [jax.jit(f).lower(x).compile(compiler_options=options)
                for f in (jax.value_and_grad(loss), fn)]
    return compiled[0](x), compiled[1](x)

  (loss, grad), y = value_and_grad(layers.gelu)
  (loss_ref, grad_ref), y_ref = value_and_grad(flax.linen.gelu)
  chex.assert_type([y, grad], dtype)
  np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(y_ref, np.float32))
  np.testing.assert_array_equal(np.asarray(grad, np.float32), np.asarray(grad_ref, np.float32))
  assert loss == loss_ref
