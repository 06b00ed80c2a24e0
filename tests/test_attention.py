"""Attention modules: shapes, equivalence with naive quadratic forms, padding
invariance, causality and the errors of the registry."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simpletron_jax.model import attention
from tests.module_support import init_variables, jit_apply

B, L, E, H = 2, 12, 16, 4


def _inputs(length=L, seed=0):
  x = jax.random.normal(jax.random.PRNGKey(seed), (B, length, E))
  return x


def _build(name, **kwargs):
  return attention.get(name).build(num_heads=H, qkv_dim=E, out_dim=E, dropout_rate=0.0,
                                   dtype=jnp.float32, **kwargs)


def _proj(params, name, x):
  p = params[name]
  return jnp.einsum("ble,ehk->blhk", x, p["kernel"]) + p["bias"]


@pytest.mark.parametrize("name", attention.names())
def test_output_shape(name):
  module = _build(name)
  x = _inputs()
  mask = jnp.ones((B, L), bool)
  params = init_variables(module, x, mask)
  y = jit_apply(module)(params, x, mask)
  chex.assert_shape(y, (B, L, E))
  chex.assert_tree_all_finite(y)


def test_init_variables_gives_module_inits_values():
  # The suite's parameters come from tests/module_support.py's init_variables, which evaluates
  # only the init's random draws: it must return what module.init returns, every collection.
  module = _build("performer")   # projections and its random features
  x, mask = _inputs(), jnp.ones((B, L), bool)
  chex.assert_trees_all_equal(init_variables(module, x, mask, seed=5),
                              module.init(jax.random.PRNGKey(5), x, mask))


@pytest.mark.parametrize("pad,layout", [(0, {}), (5, {}), (3, {"block_diagonal": True})])
def test_simple_equals_naive_quadratic_form(pad, layout):
  module = _build("simple", **layout)
  x = _inputs(L + pad)
  lengths = jnp.array([L, L - 4])
  mask = jnp.arange(L + pad)[None, :] < lengths[:, None]
  params = init_variables(module, x, mask)
  y = jit_apply(module)(params, x, mask)
  p = params["params"]
  q, k, v = (_proj(p, n, x) for n in ("query", "key", "value"))
  m = mask[:, :, None, None]
  scores_BxHxLxL = jnp.einsum("bihd,bjhd->bhij", q, k * m)          # (Q K^T), pads dropped
  naive = jnp.einsum("bhij,bjhd->bihd", scores_BxHxLxL, v * m)     # (Q K^T) V
  naive = naive / jnp.sqrt(lengths.astype(jnp.float32))[:, None, None, None]
  naive = naive.reshape(B, L + pad, E)
  real = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(y)[real], np.asarray(naive)[real], rtol=1e-5, atol=1e-5)


def test_flat_head_projection_is_dense_general():
  # The same parameters and initial values as nn.DenseGeneral to (H, K), bit for bit; the
  # same outputs and gradients up to float rounding (the weight gradient's sum is grouped
  # differently on CPU).
  import flax.linen as nn  # noqa: PLC0415
  from simpletron_jax.model.attention import base  # noqa: PLC0415
  x = _inputs(L + 5)
  dense = nn.DenseGeneral(features=(H, E // H), kernel_init=base.KERNEL_INIT,
                          bias_init=base.BIAS_INIT)
  flat = base.HeadProjection(H, E // H)
  params = init_variables(dense, x, seed=3)   # module.init's values (tests/module_support.py)
  chex.assert_trees_all_equal(init_variables(flat, x, seed=3), params)

  def out_and_grads(module):
    loss = lambda p, t: jnp.sum(jnp.sin(module.apply(p, t)))  # noqa: E731
    return jax.jit(lambda p, t: (module.apply(p, t), jax.grad(loss, (0, 1))(p, t)))(params, x)
  chex.assert_trees_all_close(out_and_grads(flat), out_and_grads(dense), rtol=1e-5, atol=1e-6)


def test_softmax_equals_naive_form():
  module = _build("softmax")
  x = _inputs()
  mask = jnp.arange(L)[None, :] < jnp.array([L, 7])[:, None]
  params = init_variables(module, x, mask)
  y = jit_apply(module)(params, x, mask)
  p = params["params"]
  q, k, v = (_proj(p, n, x) for n in ("query", "key", "value"))
  logits = jnp.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(E // H)
  logits = jnp.where(mask[:, None, None, :], logits, -jnp.inf)
  heads = jnp.einsum("bhij,bjhd->bihd", jax.nn.softmax(logits, -1), v)
  naive = jnp.einsum("blhk,hko->blo", heads, p["out"]["kernel"]) + p["out"]["bias"]
  real = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(y)[real], np.asarray(naive)[real], rtol=1e-5, atol=1e-5)


def test_fused_softmax_matches_einsum():
  x = _inputs()
  mask = jnp.arange(L)[None, :] < jnp.array([L, 7])[:, None]
  einsum_mod, fused_mod = _build("softmax"), _build("softmax", implementation="fused")
  params = init_variables(einsum_mod, x, mask)
  real = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(jit_apply(fused_mod)(params, x, mask))[real],
                             np.asarray(jit_apply(einsum_mod)(params, x, mask))[real],
                             rtol=1e-5, atol=1e-5)


def _causal_kwargs(name):
  fields = {f.name for f in dataclasses.fields(attention.get(name).module)}
  if "causal" not in fields:
    return None
  return {"causal": True, **({"chunk_size": 4} if "chunk_size" in fields else {})}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", attention.names())
def test_padding_invariance(name, causal):
  kwargs = _causal_kwargs(name) if causal else {}
  if kwargs is None:
    pytest.skip(f"{name} has no causal form")
  module = _build(name, **kwargs)
  x = _inputs()
  mask = jnp.arange(L)[None, :] < jnp.array([L, 9])[:, None]
  params = init_variables(module, x, mask)
  apply = jit_apply(module)   # both lengths compiled alike, one program each
  y = apply(params, x, mask)
  pads = 7
  x_padded = jnp.concatenate([x, 100.0 * _inputs(pads, seed=3)], axis=1)
  mask_padded = jnp.concatenate([mask, jnp.zeros((B, pads), bool)], axis=1)
  # The padded values differ from the unpadded run's filler too: garbage at pads.
  x_padded = jnp.where(mask_padded[..., None], x_padded, 55.0)
  y_padded = apply(params, x_padded, mask_padded)
  real = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(y_padded)[:, :L][real], np.asarray(y)[real],
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["softmax", "simple"])
def test_causality(name):
  kwargs = {"causal": True, "chunk_size": 5} if name == "simple" else {"causal": True}
  module = _build(name, **kwargs)
  x = _inputs()
  params = init_variables(module, x)
  cut = 7
  x_changed = x.at[:, cut:].set(jax.random.normal(jax.random.PRNGKey(9), (B, L - cut, E)))
  y, y_changed = jit_apply(module)(params, x), jit_apply(module)(params, x_changed)
  np.testing.assert_allclose(np.asarray(y_changed)[:, :cut], np.asarray(y)[:, :cut],
                             rtol=1e-5, atol=1e-5)
  assert not np.allclose(np.asarray(y_changed)[:, cut:], np.asarray(y)[:, cut:])


def test_causal_simple_equals_naive_lower_triangular_form():
  module = _build("simple", causal=True, chunk_size=5)  # L=12: chunks do not divide L
  x = _inputs()
  params = init_variables(module, x)
  y = jit_apply(module)(params, x)
  p = params["params"]
  q, k, v = (_proj(p, n, x) for n in ("query", "key", "value"))
  scores = jnp.einsum("bihd,bjhd->bhij", q, k) * jnp.tril(jnp.ones((L, L)))
  naive = jnp.einsum("bhij,bjhd->bihd", scores, v) / jnp.sqrt(jnp.arange(1, L + 1))[None, :, None, None]
  np.testing.assert_allclose(np.asarray(y), np.asarray(naive.reshape(B, L, E)),
                             rtol=1e-4, atol=1e-5)


def test_simple_has_no_output_projection_and_resl_has_one():
  x = _inputs()
  simple_params = jax.eval_shape(_build("simple").init, jax.random.PRNGKey(0), x)["params"]
  resl_params = jax.eval_shape(_build("simple_resl").init, jax.random.PRNGKey(0), x)["params"]
  assert set(simple_params) == {"query", "key", "value"}
  assert set(resl_params) == {"query", "key", "value", "out"}
  assert attention.get("simple_res").double_skip and not attention.get("simple").double_skip


def test_unknown_attention_name_is_a_clear_error():
  with pytest.raises(ValueError, match=r"unknown attention 'nope'.*model\.attention.*simple"):
    attention.get("nope")


def test_simple_needs_qkv_dim_equal_to_emb_dim():
  module = attention.get("simple").build(num_heads=H, qkv_dim=2 * E, out_dim=E,
                                         dropout_rate=0.0, dtype=jnp.float32)
  with pytest.raises(ValueError, match=r"qkv_dim \(32\) must equal model\.emb_dim \(16\)"):
    module.init(jax.random.PRNGKey(0), _inputs())


def test_attention_kwargs_are_checked():
  with pytest.raises(ValueError, match="may not set"):
    attention.get("simple").build(num_heads=H, qkv_dim=E, out_dim=E, dropout_rate=0.0,
                                  dtype=jnp.float32, use_output_proj=True)
  with pytest.raises(ValueError, match="unknown to attention"):
    _build("softmax", num_random_features=3)
