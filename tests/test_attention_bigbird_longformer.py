"""BigBird and Longformer attention as LRA's code computes them: equivalence with dense masked
softmax attention under each pattern written out here in numpy, LRA's random-block draw
(structure, seeds, layers), padding invariance of the defaults, and the ``lra_bugs`` options
(``models/bigbird/bigbird_attention.py``, ``models/longformer/longformer_attention.py``).
The golden comparison with LRA's own code is tests/test_lra_golden.py.

Shapes: B=2, E=16, H=4 (per-head width 4); 13 tokens (real lengths 13 and 9), optionally
padded to 20; blocks of 2-3 so that block and padding edges fall inside the sequence.
"""

import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simpletron_jax.model import attention
from simpletron_jax.model.attention import bigbird as bigbird_lib
from tests.module_support import init_variables
from tests.test_attention import _build, _proj

B, E, H = 2, 16, 4
K = E // H
T, LENGTHS = 13, (13, 9)


def _data(pad, garbage=False):
  """[B, T + pad, E] inputs with real lengths LENGTHS; garbage=True puts junk at the pads."""
  x = jax.random.normal(jax.random.PRNGKey(0), (B, T, E))
  x = jnp.concatenate([x, jax.random.normal(jax.random.PRNGKey(2), (B, pad, E))], axis=1)
  mask = jnp.arange(T + pad)[None, :] < jnp.array(LENGTHS)[:, None]
  if garbage:
    x = jnp.where(mask[..., None], x, 55.0 + 100.0 * x)
  return x, mask


@functools.lru_cache(maxsize=None)
def _params(name):
  x, mask = _data(0)
  return init_variables(_build(name), x, mask, seed=1)


@functools.lru_cache(maxsize=None)
def _jitted_apply(module):
  return jax.jit(lambda p, x, m: module.apply(p, x, m, mutable=["intermediates"]))


def _apply(module, x, mask, name):
  y, state = _jitted_apply(module)(_params(name), x, mask)
  return y, state.get("intermediates", {})


def _dense(p, x, keys, pattern_BxHxLxL, q_names=("query", "key", "value")):
  """softmax(Q K^T / sqrt(d), allowed = pattern & keys) V per head, [B, L, H, K]."""
  q, k, v = (_proj(p, n, x) for n in q_names)
  logits = jnp.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(K)
  allowed = pattern_BxHxLxL & keys[:, None, None, :]
  weights = jax.nn.softmax(jnp.where(allowed, logits, -jnp.inf), -1)
  return jnp.einsum("bhij,bjhd->bihd", jnp.where(allowed, weights, 0.0), v)


def _out(p, heads_BxLxHxK):
  return jnp.einsum("blhk,hko->blo", heads_BxLxHxK, p["out"]["kernel"]) + p["out"]["bias"]


def _assert_rows_close(y, expected, rows):
  chex.assert_equal_shape([y, expected])
  chex.assert_tree_all_finite(y)
  rows = np.asarray(rows)
  np.testing.assert_allclose(np.asarray(y)[rows], np.asarray(expected)[rows], rtol=1e-5,
                             atol=1e-5)


# --- BigBird -----------------------------------------------------------------------------------

def _bigbird_pattern(length, block, random_HxNxr, pattern_length):
  """Blocks 0 and N-1 global; block n sees {0, n-1, n, n+1, N-1} and its random blocks."""
  num_blocks = pattern_length // block + 1
  size = num_blocks * block
  pattern = np.zeros((H, size, size), bool)
  for h in range(H):
    for n in range(num_blocks):
      rows = slice(n * block, (n + 1) * block)
      if n in (0, num_blocks - 1):
        pattern[h, rows, :] = True
        pattern[h, :, rows] = True
      for m in {0, n - 1, n, n + 1, num_blocks - 1} | {int(j) for j in random_HxNxr[h, n]}:
        if 0 <= m < num_blocks:
          pattern[h, rows, m * block:(m + 1) * block] = True
  return np.broadcast_to(pattern[None, :, :length, :length], (B, H, length, length))


@pytest.mark.parametrize("block,num_random,pad,max_length", [
    (2, 2, 7, 0), (3, 1, 7, 0), (2, 0, 0, 0), (2, 1, 0, 20), (64, 3, 0, 0)])
def test_bigbird_equals_dense_pattern(block, num_random, pad, max_length):
  module = _build("bigbird", block_size=block, num_random_blocks=num_random,
                  max_length=max_length)
  x, mask = _data(pad)
  y, inter = _apply(module, x, mask, "bigbird")
  (random_HxNxr,) = inter["random_blocks"]
  pattern_length = max_length or T + pad
  num_blocks = pattern_length // block + 1
  chex.assert_shape(random_HxNxr, (H, num_blocks, num_random))
  pattern = _bigbird_pattern(T + pad, block, np.asarray(random_HxNxr), pattern_length)
  assert pattern.all() == (block == 64)
  p = _params("bigbird")["params"]
  _assert_rows_close(y, _out(p, _dense(p, x, mask, pattern)), mask)


def test_bigbird_random_blocks_are_lra_draws():
  """get_block_rand_mask's structure: rows 1..N-2 draw r distinct blocks outside the window
  and the global blocks; the draw is numpy's, seeded by random_seed + layer, head by head."""
  num_blocks, block, r = 12, 2, 3
  idx = bigbird_lib.lra_random_blocks(num_blocks, block, H, r, 0)
  assert (idx[:, 0] == -1).all() and (idx[:, -1] == -1).all()
  for h in range(H):
    for n in range(1, num_blocks - 1):
      got = set(idx[h, n].tolist())
      assert len(got) == r and not got & {0, n - 1, n, n + 1, num_blocks - 1}, (h, n, got)
      assert got <= set(range(1, num_blocks - 1))
  assert any(not np.array_equal(idx[0], idx[h]) for h in range(1, H))
  # numpy.random.seed(s) then permutation(...), as LRA: the first row of head 0.
  rng = np.random.RandomState(5)
  np.testing.assert_array_equal(
      bigbird_lib.lra_random_blocks(num_blocks, block, H, r, 5)[0, 1],
      rng.permutation(np.arange(3, num_blocks - 1))[:r])
  assert not np.array_equal(bigbird_lib.lra_random_blocks(num_blocks, block, H, r, 1), idx)
  # Fewer candidates than r (LRA raises): as many as there are, then -1.
  small = bigbird_lib.lra_random_blocks(6, block, H, r, 0)   # row 1: candidates 3 and 4
  assert (small[:, 1, 2] == -1).all()
  assert all(sorted(small[h, 1, :2].tolist()) == [3, 4] for h in range(H))


def test_bigbird_layer_index_seeds_the_pattern():
  assert bigbird_lib.layer_index(("encoder", "encoderblock_3", "attention")) == 3
  assert bigbird_lib.layer_index(()) == 0

  class Block(nn.Module):
    @nn.compact
    def __call__(self, x, mask):
      return attention.get("bigbird").build(num_heads=H, qkv_dim=E, out_dim=E,
                                            dropout_rate=0.0, dtype=jnp.float32, block_size=2,
                                            num_random_blocks=2, name="attention")(x, mask)

  class Encoder(nn.Module):   # the path of block i's attention: encoderblock_i/attention
    layer: int

    @nn.compact
    def __call__(self, x, mask):
      return Block(name=f"encoderblock_{self.layer}")(x, mask)

  x, mask = _data(0)
  seen = []
  for layer in (0, 1):
    module = Encoder(layer)
    params = module.init(jax.random.PRNGKey(0), x, mask)
    _, state = module.apply(params, x, mask, mutable=["intermediates"])
    (got,) = state["intermediates"][f"encoderblock_{layer}"]["attention"]["random_blocks"]
    np.testing.assert_array_equal(got, bigbird_lib.lra_random_blocks(T // 2 + 1, 2, H, 2, layer))
    seen.append(np.asarray(got))
  assert not np.array_equal(*seen)


def test_bigbird_default_is_padding_invariant_with_max_length():
  module = _build("bigbird", block_size=2, num_random_blocks=2, max_length=T + 7)
  y, _ = _apply(module, *_data(0), "bigbird")
  y_padded, _ = _apply(module, *_data(7, garbage=True), "bigbird")
  _assert_rows_close(y_padded[:, :T], y, _data(0)[1])


def test_bigbird_lra_bugs_appended_keys_are_real_and_pad_rows_zero():
  block = 3   # 13 tokens: padded by 2 zero positions to 15 (5 blocks)
  module = _build("bigbird", block_size=block, num_random_blocks=1, lra_bugs=True)
  x, mask = _data(0)
  y, inter = _apply(module, x, mask, "bigbird")
  (random_HxNxr,) = inter["random_blocks"]
  p = _params("bigbird")["params"]
  # Dense attention on the input with 2 appended zero rows, which are real keys.
  x_ext = jnp.pad(x, ((0, 0), (0, 2), (0, 0)))
  keys_ext = jnp.pad(mask, ((0, 0), (0, 2)), constant_values=True)
  pattern = _bigbird_pattern(T + 2, block, np.asarray(random_HxNxr), T)
  expected = _out(p, _dense(p, x_ext, keys_ext, pattern)[:, :T])
  _assert_rows_close(y, expected, mask)
  # Padding queries: zero before the output projection (its bias only).
  pads = ~np.asarray(mask)
  np.testing.assert_allclose(np.asarray(y)[pads],
                             np.broadcast_to(p["out"]["bias"], (pads.sum(), E)), atol=1e-6)
  # The default differs at real positions (the appended keys take weight there).
  y_default, _ = _apply(_build("bigbird", block_size=block, num_random_blocks=1), x, mask,
                        "bigbird")
  assert not np.allclose(np.asarray(y_default)[np.asarray(mask)],
                         np.asarray(y)[np.asarray(mask)], atol=1e-4)


@pytest.mark.parametrize("kwargs,field", [
    ({"max_length": -1}, "max_length"), ({"max_length": 5}, "max_length"),
    ({"random_seed": -1}, "random_seed")])
def test_bigbird_bad_options_name_the_config_field(kwargs, field):
  with pytest.raises(ValueError, match=rf"model\.attention_kwargs\.{field}"):
    jax.eval_shape(_build("bigbird", **kwargs).init, jax.random.PRNGKey(0), _data(0)[0])


# --- Longformer --------------------------------------------------------------------------------

def _longformer_pattern(length, window, global_first):
  left, right = window - window // 2, window // 2   # left side includes the query itself
  i, j = np.meshgrid(np.arange(length), np.arange(length), indexing="ij")
  allowed = (i - j < left) & (j - i <= right)
  if global_first:
    allowed[:, 0] = True
  return np.broadcast_to(allowed, (B, H, length, length))


def test_longformer_has_lra_parameters():
  shapes = jax.tree.map(lambda a: a.shape, _params("longformer")["params"])
  assert set(shapes) == {"query", "key", "value", "query_global", "key_global",
                         "value_global", "out"}
  assert shapes["query_global"]["kernel"] == (E, H, K)


@pytest.mark.parametrize("window,pad,global_first", [
    (1, 0, False), (4, 7, False), (5, 0, True), (4, 7, True), (512, 0, False)])
def test_longformer_equals_dense_window(window, pad, global_first):
  module = _build("longformer", window=window, global_first=global_first)
  x, mask = _data(pad)
  y, _ = _apply(module, x, mask, "longformer")
  p = _params("longformer")["params"]
  pattern = _longformer_pattern(T + pad, window, global_first)
  heads = _dense(p, x, mask, pattern)
  if global_first:   # position 0 attends to every key, with the global projections
    everything = np.ones((B, H, T + pad, T + pad), bool)
    row0 = _dense(p, x, mask, everything, ("query_global", "key_global", "value_global"))
    heads = heads.at[:, 0].set(row0[:, 0])
  _assert_rows_close(y, _out(p, heads), mask)
  assert pattern[0, 0, T // 2].sum() == min(window, T + pad) + (global_first and window < 12)


def test_longformer_default_is_padding_invariant():
  for global_first in (False, True):
    module = _build("longformer", window=5, global_first=global_first)
    y, _ = _apply(module, *_data(0), "longformer")
    y_padded, _ = _apply(module, *_data(7, garbage=True), "longformer")
    _assert_rows_close(y_padded[:, :T], y, _data(0)[1])


def test_longformer_lra_bugs_pad_rows_are_uniform_over_every_position():
  x, mask = _data(7)
  y_bug, _ = _apply(_build("longformer", window=4, lra_bugs=True), x, mask, "longformer")
  y, _ = _apply(_build("longformer", window=4), x, mask, "longformer")
  _assert_rows_close(y_bug, y, mask)   # real rows unchanged
  p = _params("longformer")["params"]
  mean_v = jnp.broadcast_to(_proj(p, "value", x).mean(axis=1, keepdims=True), (B, T + 7, H, K))
  _assert_rows_close(y_bug, _out(p, mean_v), ~np.asarray(mask))
  assert not np.allclose(np.asarray(y)[~np.asarray(mask)], np.asarray(y_bug)[~np.asarray(mask)])
