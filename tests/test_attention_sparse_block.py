"""Local, sparse (fixed) and BigBird attention (BigBird's and Longformer's own tests are in
test_attention_bigbird_longformer.py): equivalence with dense masked
softmax attention under each variant's own pattern written out here in numpy, padding
invariance with small blocks, BigBird's random-block structure, dropout and errors.

Shapes: B=2, E=16, H=4 (per-head width 4); sequences of 13 tokens (real lengths 13 and 9),
optionally padded to 20, with blocks of 2-5 (and one longer than the sequence) so that block
and padding edges fall inside the sequence. The no-``L x L`` memory test for the default
options is in test_attention_variants.py; shapes and padding with the default options in
test_attention.py and test_models.py.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simpletron_jax.model import attention
from tests.module_support import init_variables
from tests.test_attention import _build, _proj

B, E, H = 2, 16, 4
K = E // H
T, LENGTHS = 13, (13, 9)
NAMES = ("local", "sparse", "bigbird")

# Everything is jitted (one compilation per module and shape, far cheaper on CPU than eager
# op-by-op dispatch). These variants have the same parameters (query/key/value/out; see
# test_registered_sub_quadratic_with_standard_parameters), so one set serves every test.


@functools.lru_cache(maxsize=None)
def _params():
  x, mask = _data(0)
  return init_variables(_build("local"), x, mask, seed=1)


def _data(pad, garbage=False):
  """[B, T + pad, E] inputs, real lengths LENGTHS; the first T positions do not depend on pad.

  With garbage=True the padded positions hold large junk (55 in the first T, then 100 N(0, 1)).
  """
  x = jax.random.normal(jax.random.PRNGKey(0), (B, T, E))
  x = jnp.concatenate([x, jax.random.normal(jax.random.PRNGKey(2), (B, pad, E))], axis=1)
  mask = jnp.arange(T + pad)[None, :] < jnp.array(LENGTHS)[:, None]
  if garbage:
    junk = jnp.where(jnp.arange(T + pad)[None, :, None] < T, 55.0, 100.0 * x)
    x = jnp.where(mask[..., None], x, junk)
  return x, mask


@functools.lru_cache(maxsize=None)
def _jitted_apply(module):
  return jax.jit(lambda p, x, m: module.apply(p, x, m, mutable=["intermediates"]))


def _apply(module, x, mask):
  """Jitted ``module.apply`` (one compilation per module and shape): ``(y, intermediates)``."""
  y, state = _jitted_apply(module)(_params(), x, mask)
  return y, state.get("intermediates", {})


@jax.jit
def _dense_attention(p, x, mask, pattern_BxHxLxL):
  """softmax(Q K^T / sqrt(d), allowed = pattern & real key) V, then the output projection."""
  q, k, v = (_proj(p, n, x) for n in ("query", "key", "value"))
  logits = jnp.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(K)
  allowed = pattern_BxHxLxL & mask[:, None, None, :]
  logits = jnp.where(allowed, logits, -jnp.inf)
  weights = jnp.where(allowed, jax.nn.softmax(logits, -1), 0.0)  # all-pad rows -> 0
  heads = jnp.einsum("bhij,bjhd->bihd", weights, v)
  return jnp.einsum("blhk,hko->blo", heads, p["out"]["kernel"]) + p["out"]["bias"]


def _assert_real_close(y, expected, mask):
  real = np.asarray(mask)
  chex.assert_equal_shape([y, expected])
  chex.assert_tree_all_finite(y)
  np.testing.assert_allclose(np.asarray(y)[real], np.asarray(expected)[real], rtol=1e-5,
                             atol=1e-5)


def _run_and_compare(module, pad, pattern_fn, full):
  """Compares with dense attention under ``pattern_fn(length, intermediates)``.

  ``full``: whether that pattern should allow every pair (a block or window longer than the
  sequence); otherwise it must leave some pairs out, so the comparison is not trivial.
  """
  x, mask = _data(pad)
  y, intermediates = _apply(module, x, mask)
  pattern = np.broadcast_to(pattern_fn(T + pad, intermediates), (B, H, T + pad, T + pad))
  assert pattern.all() == full
  _assert_real_close(y, _dense_attention(_params()["params"], x, mask, pattern), mask)
  return pattern


# --- Patterns, written out position by position -------------------------------------------

def _local_pattern(length, block):
  """LRA's strided groups: L padded by block - L % block, N = padded / block groups."""
  groups = (length + block - length % block) // block
  i, j = np.meshgrid(np.arange(length), np.arange(length), indexing="ij")
  return i % groups == j % groups


def _sparse_pattern(length, block, c, global_first):
  start = 1 if global_first else 0
  p = np.arange(length) - start        # position on the block grid
  i, j = p[:, None], p[None, :]
  allowed = (i // block == j // block) | (j % block == 0) | (j % block >= block - c)
  if global_first:
    allowed[0, :] = True
    allowed[:, 0] = True
  return allowed


# --- Equivalence with dense masked attention -----------------------------------------------

# pad = 7 puts padding inside a block and adds whole padding blocks; the second example
# (9 real tokens) has padding in every case.
@pytest.mark.parametrize("block,pad", [(4, 7), (5, 0), (64, 0)])
def test_local_equals_dense_strided_group_attention(block, pad):
  _run_and_compare(_build("local", block_size=block), pad,
                   lambda length, _: _local_pattern(length, block), full=block == 64)


@pytest.mark.parametrize("block,c,global_first,pad", [(4, 2, True, 7), (4, 2, False, 0),
                                                      (3, 3, False, 7), (64, 10, True, 0)])
def test_sparse_equals_dense_fixed_pattern(block, c, global_first, pad):
  module = _build("sparse", block_size=block, num_summary=c, global_first=global_first)
  pattern = _run_and_compare(module, pad,
                             lambda length, _: _sparse_pattern(length, block, c, global_first),
                             full=c == block or block == 64)
  if (block, c) == (4, 2):  # own block (4) + 3 summaries (offsets 0, 2, 3) in each other
    assert 0.3 < pattern[0, 0, 1:, 1:].mean() < 0.9


# --- Padding invariance with small blocks (the generic test uses the defaults) --------------
# Local's strided groups follow the padded length (LRA's design), so appending pads changes
# them; its invariance to what the pads hold is in test_attention_local_sparse_lra.py.

@pytest.mark.parametrize("name,kwargs", [
    ("sparse", {"block_size": 4, "num_summary": 2}),
    ("sparse", {"block_size": 3, "num_summary": 1, "global_first": False}),
    ("bigbird", {"block_size": 2, "num_random_blocks": 2, "max_length": T + 7}),
])
def test_padding_invariance_small_blocks(name, kwargs):
  module = _build(name, **kwargs)
  y, _ = _apply(module, *_data(0))
  y_padded, _ = _apply(module, *_data(7, garbage=True))   # 7 more pads holding junk
  _assert_real_close(y_padded[:, :T], y, _data(0)[1])


# --- Dropout, registry and errors -----------------------------------------------------------

SMALL = {"local": {"block_size": 4}, "sparse": {"block_size": 4, "num_summary": 2},
         "bigbird": {"block_size": 2, "num_random_blocks": 2}}


@pytest.mark.parametrize("name", NAMES)
def test_attention_dropout_applies_only_in_training(name):
  module = attention.get(name).build(num_heads=H, qkv_dim=E, out_dim=E, dropout_rate=0.5,
                                     dtype=jnp.float32, **SMALL[name])
  x, mask = _data(0)
  np.testing.assert_array_equal(_apply(module, x, mask)[0],
                                _apply(_build(name, **SMALL[name]), x, mask)[0])
  # "rbg" keys: XLA's RngBitGenerator compiles much faster on CPU than threefry.
  train = jax.jit(lambda p, x, m, rng: module.apply(p, x, m, deterministic=False,
                                                     rngs={"dropout": rng}))
  y_a, y_b = (train(_params(), x, mask, jax.random.key(seed, impl="rbg")) for seed in (0, 1))
  y = _apply(module, x, mask)[0]
  assert not np.allclose(y_a, y) and not np.allclose(y_a, y_b)


def test_registered_sub_quadratic_with_standard_parameters():
  shared = jax.tree.map(lambda a: (a.shape, a.dtype), _params())
  for name in NAMES:
    spec = attention.get(name)
    assert not spec.quadratic and spec.paper
    for kwargs in ({}, SMALL[name]):
      shapes = jax.eval_shape(_build(name, **kwargs).init, jax.random.PRNGKey(0), *_data(0))
      assert jax.tree.map(lambda a: (a.shape, a.dtype), shapes) == shared


@pytest.mark.parametrize("name,kwargs,field", [
    ("local", {"block_size": 0}, "block_size"),
    ("sparse", {"block_size": 0}, "block_size"),
    ("sparse", {"num_summary": 0}, "num_summary"),
    ("sparse", {"block_size": 4, "num_summary": 5}, "num_summary"),
    ("bigbird", {"block_size": 0}, "block_size"),
    ("bigbird", {"num_random_blocks": -1}, "num_random_blocks"),
    ("bigbird", {"random_seed": -1}, "random_seed"),
])
def test_bad_options_name_the_config_field(name, kwargs, field):
  with pytest.raises(ValueError, match=rf"model\.attention_kwargs\.{field}="):
    jax.eval_shape(_build(name, **kwargs).init, jax.random.PRNGKey(0), _data(0)[0])
