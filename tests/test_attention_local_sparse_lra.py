"""Local and sparse attention: LRA's bugs as ``lra_bugs`` options, and the LRA design choices
their configs take by default.

``lra_bugs=True`` is checked against dense numpy references written from LRA's code
(``models/local/local_attention.py``, ``models/sparse_transformer/sparse_attention.py``):
padded-and-reshaped local attention with the contiguous (misaligned) padding mask, and the
causal fixed pattern with query AND key masking by a ``-1e10`` bias. The defaults ignore what
the pads hold; the LRA options do not. The golden logits of LRA's own code are in
test_lra_golden.py.

Shapes: B=2, E=16, H=4 (per-head width 4); 13 positions, real lengths 13 and 9; blocks 4.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import lra
from tests.module_support import init_variables
from tests.test_attention import _build, _proj

B, E, H = 2, 16, 4
K = E // H
T, LENGTHS = 13, (13, 9)
BLOCK, SUMMARY = 4, 2


def _data(garbage=0.0):
  """[B, T, E] inputs and their mask; ``garbage`` != 0 replaces the pads' inputs by it."""
  x = jax.random.normal(jax.random.PRNGKey(0), (B, T, E))
  mask = jnp.arange(T)[None, :] < jnp.array(LENGTHS)[:, None]
  if garbage:
    x = jnp.where(mask[..., None], x, garbage * jax.random.normal(jax.random.PRNGKey(5), x.shape))
  return x, mask


@functools.lru_cache(maxsize=None)
def _params():
  x, mask = _data()
  return init_variables(_build("local"), x, mask, seed=1)


@functools.lru_cache(maxsize=None)
def _jitted(module):
  return jax.jit(module.apply)


def _apply(module, x, mask):
  return np.asarray(_jitted(module)(_params(), x, mask))


def _lra_softmax_attention(p, x, allowed_BxLxL):
  """Dense attention over the given positions with LRA's masking: logits + (0 or -1e10)
  (query AND key already in ``allowed``), softmax, values, output projection."""
  q, k, v = (_proj(p, n, x) for n in ("query", "key", "value"))
  logits = jnp.einsum("bihd,bjhd->bhij", q / np.sqrt(K), k)
  logits = logits + jnp.where(allowed_BxLxL[:, None], 0.0, -1e10)
  heads = jnp.einsum("bhij,bjhd->bihd", jax.nn.softmax(logits, -1), v)
  return jnp.einsum("blhk,hko->blo", heads, p["out"]["kernel"]) + p["out"]["bias"]


def _lra_local_reference(p, x, mask):
  """LRA's local attention, position by position: L padded by b - L % b (zero inputs, mask
  True), groups {p mod N}, the mask of query p = i N + n and key j N + n read at positions
  n b + i and n b + j."""
  b = BLOCK
  padded = T + b - T % b
  n_groups = padded // b
  x_pad = jnp.pad(x, ((0, 0), (0, padded - T), (0, 0)))
  real = np.pad(np.asarray(mask), ((0, 0), (0, padded - T)), constant_values=True)
  pos = np.arange(padded)
  group, slot = pos % n_groups, pos // n_groups          # p = slot * N + group
  read_at = group * b + slot                             # where LRA reads p's mask flag
  same_group = group[:, None] == group[None, :]
  allowed = same_group[None] & real[:, read_at][:, :, None] & real[:, read_at][:, None, :]
  # Each row holds the b keys of its group; a row with none allowed is uniform over them,
  # which the dense form gives by the same -1e10 bias only if the other groups are
  # excluded: give them -inf instead.
  q, k, v = (_proj(p, n, x_pad) for n in ("query", "key", "value"))
  logits = jnp.einsum("bihd,bjhd->bhij", q / np.sqrt(K), k)
  logits = logits + jnp.where(allowed[:, None], 0.0, -1e10)
  logits = jnp.where(same_group[None, None], logits, -jnp.inf)
  heads = jnp.einsum("bhij,bjhd->bihd", jax.nn.softmax(logits, -1), v)
  y = jnp.einsum("blhk,hko->blo", heads, p["out"]["kernel"]) + p["out"]["bias"]
  return y[:, :T]


def _lra_sparse_allowed(mask, global_first):
  """LRA's ``Fixed1Pattern`` | ``Fixed2Pattern`` AND causal, on the positions after CLS,
  CLS row and column whole, AND query AND key real."""
  start = int(global_first)
  r = np.arange(T - start)
  i, j = r[:, None], r[None, :]
  pattern = (j <= i) & ((i // BLOCK == j // BLOCK) | (j % BLOCK == 0)
                        | (j % BLOCK >= BLOCK - SUMMARY))
  if global_first:
    pattern = np.pad(pattern, ((1, 0), (1, 0)), constant_values=True)
  real = np.asarray(mask)
  return pattern[None] & real[:, :, None] & real[:, None, :]


def test_local_lra_bugs_equals_lra_reference_at_every_position():
  x, mask = _data()
  y = _apply(_build("local", block_size=BLOCK, lra_bugs=True), x, mask)
  expected = _lra_local_reference(_params()["params"], x, mask)
  np.testing.assert_allclose(y, np.asarray(expected), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("global_first", [True, False])
def test_sparse_lra_bugs_equals_lra_reference_at_every_position(global_first):
  x, mask = _data()
  module = _build("sparse", block_size=BLOCK, num_summary=SUMMARY, global_first=global_first,
                  lra_bugs=True)
  expected = _lra_softmax_attention(_params()["params"], x,
                                    _lra_sparse_allowed(mask, global_first))
  np.testing.assert_allclose(_apply(module, x, mask), np.asarray(expected), rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize("name,kwargs", [
    ("local", {"block_size": BLOCK}),
    ("sparse", {"block_size": BLOCK, "num_summary": SUMMARY}),
    ("sparse", {"block_size": BLOCK, "num_summary": SUMMARY, "global_first": False}),
])
def test_default_ignores_pad_contents_and_lra_bugs_do_not(name, kwargs):
  x, mask = _data()
  x_junk, _ = _data(garbage=50.0)
  real = np.asarray(mask)
  fixed, lra_module = _build(name, **kwargs), _build(name, lra_bugs=True, **kwargs)
  np.testing.assert_allclose(_apply(fixed, x_junk, mask)[real], _apply(fixed, x, mask)[real],
                             rtol=1e-5, atol=1e-5)
  if name == "local":   # LRA's misaligned mask lets pads into real rows
    assert not np.allclose(_apply(lra_module, x_junk, mask)[real],
                           _apply(lra_module, x, mask)[real], atol=1e-3)
  else:                 # real rows: the causal pattern differs from the default's
    assert not np.allclose(_apply(lra_module, x, mask)[real], _apply(fixed, x, mask)[real],
                           atol=1e-3)
    # pad rows: uniform over every key, so they follow the pads' contents
    assert not np.allclose(_apply(lra_module, x_junk, mask)[~real],
                           _apply(lra_module, x, mask)[~real], atol=1e-3)


@pytest.mark.parametrize("task,pool", [("listops", "CLS"), ("text", "CLS"),
                                       ("retrieval", "CLS"), ("image", "MEAN"),
                                       ("pathfinder", "MEAN")])
def test_configs_take_lra_pooling_and_no_bug_options(task, pool):
  local = lra.make_config(task, "local").model
  assert local.classifier_pool == pool   # LRA's: CLS, MEAN in its image/pathfinder configs
  assert local.attention_kwargs.lra_bugs is False
  sparse = lra.make_config(task, "sparse").model
  assert sparse.attention_kwargs.global_first == (sparse.classifier_pool == "CLS")
  assert sparse.attention_kwargs.lra_bugs is False
  assert (sparse.attention_kwargs.block_size, sparse.attention_kwargs.num_summary) == (50, 10)
