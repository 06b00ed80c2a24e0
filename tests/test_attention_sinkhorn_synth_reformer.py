"""Sinkhorn, Synthesizer (dense, random) and Reformer (LSH) attention: equivalence with
naive references written here in numpy, padding invariance with small blocks and chunks,
the LSH hash, and errors naming the config fields.

Shapes: B=2, L=12, E=16, H=4 (per-head width 4), as in test_attention.py. Shapes and
padding invariance with default options (and the no-``L x L`` memory test) for every
registered name are in test_attention.py, test_models.py and test_attention_variants.py.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simpletron_jax.model import attention
from simpletron_jax.model.attention import reformer as reformer_lib
from simpletron_jax.model.attention import sinkhorn as sinkhorn_lib
from simpletron_jax.model.attention import synthesizer as synthesizer_lib
from tests.module_support import init_variables, jit_apply
from tests.test_attention import _build
from tests.test_attention_variants import (_assert_real_close, _check_padding_invariance,
                                           _inputs, _mask, _quadratic_shapes)

B, L, E, H = 2, 12, 16, 4
K = E // H


def _np(p):
  return jax.tree.map(lambda a: np.asarray(a, np.float64), p)


def _np_proj(p, name, x):
  """``[B, L, H, K]`` projection in float64."""
  return np.einsum("ble,ehk->blhk", np.asarray(x, np.float64), p[name]["kernel"]) + p[name]["bias"]


def _np_out(p, heads_BxLxHxK):
  return np.einsum("blhk,hko->blo", heads_BxLxHxK, p["out"]["kernel"]) + p["out"]["bias"]


def _np_lse(a, axis):
  m = np.max(a, axis=axis, keepdims=True)
  return m + np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True))


def _np_softmax(a):
  return np.exp(a - _np_lse(a, -1))


# The parameters come from ``init_variables`` and the calls are jitted (``jit_apply``): one
# program per module and shape, not one compile per eager operation.

def _apply_sown(module, params, x, mask):
  """``(y, intermediates)``."""
  return jit_apply(module, sown=True)(params, x, mask)


def _apply(module, x, mask, seed=1):
  params = init_variables(module, x, mask, seed=seed)
  return params, jit_apply(module)(params, x, mask)


# --- Sinkhorn (Tay et al., 2020) -----------------------------------------------------------

def _np_sinkhorn_perm(logits_NxN, valid_N, iters):
  """The paper's S^k = F_c(F_r(S^(k-1))) in log space, on the valid sub-matrix only."""
  idx = np.flatnonzero(valid_N)
  la = logits_NxN[np.ix_(idx, idx)]
  for _ in range(iters):
    la = la - _np_lse(la, 1)   # rows
    la = la - _np_lse(la, 0)   # columns
  perm = np.zeros_like(logits_NxN)
  perm[np.ix_(idx, idx)] = np.exp(la)
  return perm


def _sinkhorn_naive(p, x, mask, block, temperature, sort="softmax", iters=1, width=None,
                    joint=False):
  """Explicit Sinkhorn attention (the default, correct form), one query at a time, float64.

  Strided groups: group g holds positions {s n + g}; the sort net reads the sum of a group's
  real keys; the local and the sorted softmaxes are added (``joint``: one softmax)."""
  mask = np.asarray(mask)
  b_, length = mask.shape
  n = -(-length // block)
  m = n if width is None else min(n, width)
  q, k, v = (_np_proj(p, name, x) for name in ("query", "key", "value"))
  out = np.zeros_like(q)
  for b in range(b_):
    real = np.zeros(n * block, bool)
    real[:length] = mask[b]
    kb, vb = (np.zeros((n * block, H, K)) for _ in range(2))
    kb[:length], vb[:length] = k[b], v[b]
    kb[~real], vb[~real] = 0.0, 0.0
    # [group, slot]: position s * n + g.
    kb, vb = (t.reshape(block, n, H, K).transpose(1, 0, 2, 3) for t in (kb, vb))
    rb = real.reshape(block, n).T
    valid = rb.any(axis=1)
    for h in range(H):
      summary = kb[:, :, h].sum(axis=1)
      logits = (summary @ p["sort_net"]["kernel"] + p["sort_net"]["bias"])[:, :m] / temperature
      if sort == "sinkhorn":
        perm = _np_sinkhorn_perm(logits, valid, iters)
      else:
        perm = np.stack([_np_softmax(np.where(valid[:m], row, -np.inf)) for row in logits])
      for t in np.flatnonzero(mask[b]):  # real queries only
        g = t % n
        sorted_k = np.einsum("j,jsk->sk", perm[g], kb[:m, :, h])
        sorted_v = np.einsum("j,jsk->sk", perm[g], vb[:m, :, h])
        sorted_real = (perm[g][:, None] * rb[:m]).sum(axis=0) > 0
        if joint:
          keys = np.concatenate([kb[g, rb[g], h], sorted_k[sorted_real]])
          vals = np.concatenate([vb[g, rb[g], h], sorted_v[sorted_real]])
          out[b, t, h] = _np_softmax(keys @ q[b, t, h] / np.sqrt(K)) @ vals
        else:
          local = _np_softmax(kb[g, rb[g], h] @ q[b, t, h] / np.sqrt(K)) @ vb[g, rb[g], h]
          srt = _np_softmax(sorted_k[sorted_real] @ q[b, t, h] / np.sqrt(K)) @ sorted_v[
              sorted_real]
          out[b, t, h] = local + srt
  return _np_out(p, out)


def _randomise_sort_net(params, seed=7, scale=2.0):
  """Larger sorting logits than the Xavier init, so the permutation is far from uniform."""
  p = dict(params["params"])
  kernel = p["sort_net"]["kernel"]
  # The scale in numpy (float32): no compile.
  p["sort_net"] = {"kernel": scale * np.asarray(jax.random.normal(jax.random.PRNGKey(seed),
                                                                  kernel.shape)),
                   "bias": p["sort_net"]["bias"]}
  return {"params": p}


@pytest.mark.parametrize("block,kwargs,pad", [
    (5, {"temperature": 2.0}, 0),                                     # LRA's row softmax
    (4, {"temperature": 0.5, "max_num_blocks": 3}, 7),                # fewer sort targets
    (4, {"sort": "sinkhorn", "sinkhorn_iters": 3, "temperature": 0.5}, 7),
    (5, {"joint_softmax": True}, 7),
])
def test_sinkhorn_equals_naive_reference(block, kwargs, pad):
  module = _build("sinkhorn", block_size=block, **kwargs)
  x, mask = _inputs(L + pad), _mask(L + pad, (L, 7))
  params = _randomise_sort_net(init_variables(module, x, mask))
  y, state = _apply_sown(module, params, x, mask)
  (perm,) = state["intermediates"]["permutation_BxHxNxM"]
  n = -(-(L + pad) // block)
  width = kwargs.get("max_num_blocks", 25)
  chex.assert_shape(perm, (B, H, n, min(n, width)))
  chex.assert_shape(params["params"]["sort_net"]["kernel"], (K, width))
  naive = _sinkhorn_naive(_np(params["params"]), x, mask, block, kwargs.get("temperature", 1.0),
                          kwargs.get("sort", "softmax"), kwargs.get("sinkhorn_iters", 1),
                          width, kwargs.get("joint_softmax", False))
  _assert_real_close(y, naive, mask, rtol=1e-4, atol=1e-5)


def test_log_sinkhorn_is_doubly_stochastic_and_ignores_invalid_blocks():
  logits = 3.0 * np.asarray(jax.random.normal(jax.random.PRNGKey(0), (2, 6, 6)))  # numpy
  valid = np.array([[True] * 6, [True, True, False, True, False, False]])
  # One program for both calls, not one per op.
  run = jax.jit(sinkhorn_lib.log_sinkhorn, static_argnums=2)
  perm = np.exp(np.asarray(run(logits, valid, 200)))
  for b in range(2):
    idx = np.flatnonzero(np.asarray(valid[b]))
    sub = perm[b][np.ix_(idx, idx)]
    np.testing.assert_allclose(sub.sum(axis=0), 1.0, atol=1e-5)
    np.testing.assert_allclose(sub.sum(axis=1), 1.0, atol=1e-4)
    outside = np.ones((6, 6), bool)
    outside[np.ix_(idx, idx)] = False
    assert np.all(perm[b][outside] == 0.0)
  # The invalid entries' logits do not matter.
  changed = logits.copy()
  changed[1, :, 4], changed[1, 2, :] = 100.0, -50.0
  np.testing.assert_array_equal(np.exp(np.asarray(run(changed, valid, 200)))[1], perm[1])


def _apply_with_pad_values(module, params, x, mask, value):
  # The pads' values set in numpy (float32): no compile.
  return jit_apply(module)(params, np.where(mask[..., None], x, np.float32(value)), mask)


@pytest.mark.parametrize("block", [4, 5])
def test_sinkhorn_ignores_what_the_pads_hold(block):
  # The groups follow the padded length (as in LRA), so invariance is to the pads' content.
  module = _build("sinkhorn", block_size=block)
  x, mask = _inputs(L + 7), _mask(L + 7, (L, 7))
  params = _randomise_sort_net(init_variables(module, x, mask))
  y_a = _apply_with_pad_values(module, params, x, mask, 0.0)
  y_b = _apply_with_pad_values(module, params, x, mask, 55.0)
  _assert_real_close(y_b, y_a, mask)
  # Pads that leave N = ceil(L / b) unchanged (12 -> 13 in groups of 5) change nothing either.
  if -(-(L + 1) // block) == -(-L // block):
    _check_padding_invariance(_build("sinkhorn", block_size=block), pads=1)


def test_sinkhorn_lra_bugs_inert_sort_net_and_pads_as_keys():
  x, mask = _inputs(L + 7), _mask(L + 7, (L, 7))
  default = _build("sinkhorn", block_size=4)
  params = init_variables(default, x, mask)
  sorted_a, sorted_b = _randomise_sort_net(params, seed=7), _randomise_sort_net(params, seed=8)
  # Default: the sort net matters. LRA's einsum: every sorted group is the sum of all groups.
  run = jit_apply(default)
  assert not np.allclose(run(sorted_a, x, mask), run(sorted_b, x, mask), atol=1e-4)
  lra = _build("sinkhorn", block_size=4, lra_bugs=True)
  run_lra = jit_apply(lra)
  np.testing.assert_allclose(run_lra(sorted_a, x, mask), run_lra(sorted_b, x, mask), atol=1e-5)
  # LRA's keys include the pads (summed into every sorted group): their content matters.
  y_a = _apply_with_pad_values(lra, params, x, mask, 0.0)
  y_b = _apply_with_pad_values(lra, params, x, mask, 55.0)
  assert not np.allclose(np.asarray(y_a)[0, :L], np.asarray(y_b)[0, :L], atol=1e-4)


def _sinkhorn_lra_naive(p, x, mask, block):
  """LRA's ``sinkhorn_attention.py`` written out (``lra_bugs=True``), float64, L % b == 0:
  sorted group = (sum of all groups' keys) * sum_l P_gl; the mask read as contiguous blocks
  (query AND key; a row with no allowed key is uniform over its b keys)."""
  mask = np.asarray(mask)
  b_, length = mask.shape
  n = length // block
  q, k, v = (_np_proj(p, name, x) for name in ("query", "key", "value"))
  out = np.zeros_like(q)

  def attend(logits, allowed, values):
    w = _np_softmax(np.where(allowed, logits, -np.inf)) if allowed.any() else np.full(
        len(logits), 1.0 / len(logits))
    return w @ values

  for b in range(b_):
    kb, vb = (t[b].reshape(block, n, H, K).transpose(1, 0, 2, 3) for t in (k, v))
    rc = mask[b].reshape(n, block)            # contiguous blocks
    for h in range(H):
      logits = (kb[:, :, h].sum(axis=1) @ p["sort_net"]["kernel"] + p["sort_net"]["bias"])
      perm = np.stack([_np_softmax(row) for row in logits[:, :n]])
      for t in range(length):
        g, s_ = t % n, t // n
        sk, sv = (kb[:, :, h].sum(axis=0) * perm[g].sum(), vb[:, :, h].sum(axis=0) * perm[g].sum())
        qt = q[b, t, h] / np.sqrt(K)
        local = attend(kb[g, :, h] @ qt, rc[g, s_] & rc[g], vb[g, :, h])
        srt = attend(sk @ qt, (rc[:, s_][:, None] & rc).any(axis=0), sv)
        out[b, t, h] = local + srt
  return _np_out(p, out)


def test_sinkhorn_lra_bugs_equals_lra_formula():
  # 19 = L + 7 is not a multiple of 4: use L + 8 = 20, groups of 4 (N = 5), rows of 12 and 7
  # real tokens, so contiguous blocks and strided groups disagree.
  module = _build("sinkhorn", block_size=4, lra_bugs=True)
  x, mask = _inputs(L + 8), _mask(L + 8, (L, 7))
  params = _randomise_sort_net(init_variables(module, x, mask))
  y = jit_apply(module)(params, x, mask)
  naive = _sinkhorn_lra_naive(_np(params["params"]), x, mask, 4)
  np.testing.assert_allclose(np.asarray(y, np.float64), naive, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kwargs,match", [
    ({"max_num_blocks": 0, "max_length": 10},
     r"model\.attention_kwargs\.max_length=10.*model\.max_length \+ 1"),
    ({"block_size": 0}, r"model\.attention_kwargs\.block_size=0"),
    ({"max_num_blocks": -1}, r"model\.attention_kwargs\.max_num_blocks=-1"),
    ({"sort": "gumbel"}, r"model\.attention_kwargs\.sort='gumbel'"),
    ({"sort": "sinkhorn", "block_size": 2, "max_num_blocks": 3},
     r"model\.attention_kwargs\.max_num_blocks=3 gives 3 sort targets for 6 groups"),
    ({"sinkhorn_iters": 0}, r"model\.attention_kwargs\.sinkhorn_iters=0"),
    ({"temperature": 0.0}, r"model\.attention_kwargs\.temperature=0\.0"),
])
def test_sinkhorn_errors_name_the_field(kwargs, match):
  with pytest.raises(ValueError, match=match):
    jax.eval_shape(_build("sinkhorn", **kwargs).init, jax.random.PRNGKey(0), _inputs())


# --- Synthesizer (Tay et al., 2021) --------------------------------------------------------

def _synth_naive(p, x, mask, logits_BxHxLxL, dot_product=False):
  """softmax(B [+ Q K^T / sqrt(d)]) V with pad keys removed, float64."""
  v = _np_proj(p, "value", x)
  if dot_product:
    q, k = _np_proj(p, "query", x), _np_proj(p, "key", x)
    logits_BxHxLxL = logits_BxHxLxL + np.einsum("bihk,bjhk->bhij", q, k) / np.sqrt(K)
  logits = np.where(np.asarray(mask)[:, None, None, :], logits_BxHxLxL, -np.inf)
  heads = np.einsum("bhij,bjhk->bihk", _np_softmax(logits), v)
  return _np_out(p, heads)


@pytest.mark.parametrize("pad,dot_product", [(0, False), (7, True)])
def test_dense_synthesizer_equals_formula(pad, dot_product):
  module = _build("synthesizer", max_length=20, dot_product=dot_product)
  x, mask = _inputs(L + pad), _mask(L + pad, (L, 7))
  params, y = _apply(module, x, mask)
  p = _np(params["params"])
  length = L + pad
  hidden = np.maximum(_np_proj(p, "syn_hidden", x), 0.0)                  # relu(W1 x + b1)
  logits = (np.einsum("bihk,hkj->bhij", hidden, p["syn_out_kernel"][:, :, :length])
            + p["syn_out_bias"][None, :, None, :length])                 # W2 h + b2, [:L]
  _assert_real_close(y, _synth_naive(p, x, mask, logits, dot_product), mask)
  extra = {"query", "key"} if dot_product else set()
  assert set(p) == {"syn_hidden", "syn_out_kernel", "syn_out_bias", "value", "out"} | extra
  chex.assert_shape(params["params"]["syn_out_kernel"], (H, K, 20))


@pytest.mark.parametrize("rank,pad,dot_product", [(0, 0, False), (3, 7, False), (0, 7, True)])
def test_trainable_random_synthesizer_equals_formula(rank, pad, dot_product):
  module = _build("synthesizer_random", max_length=20, factorized_rank=rank,
                  dot_product=dot_product)
  x, mask = _inputs(L + pad), _mask(L + pad, (L, 7))
  params, y = _apply(module, x, mask)
  p = _np(params["params"])
  n = L + pad
  if rank == 0:
    r = p["random_logits"][:, :n, :n]
    chex.assert_shape(params["params"]["random_logits"], (H, 20, 20))
  else:
    r = np.einsum("hik,hkj->hij", p["random_factor1"][:, :n], p["random_factor2"][:, :, :n])
  logits = np.broadcast_to(r[None], (B, H, n, n))
  _assert_real_close(y, _synth_naive(p, x, mask, logits, dot_product), mask)
  assert ("query" in p) == dot_product


@pytest.mark.parametrize("rank", [0, 3])
def test_fixed_random_synthesizer_uses_seeded_rows(rank):
  module = _build("synthesizer_random", max_length=20, trainable=False, factorized_rank=rank,
                  random_seed=4)
  x, mask = _inputs(), _mask()
  params = init_variables(module, x, mask)
  # Eager calls: the rows are drawn in the call, and the draws (compiled once per shape)
  # are shared by these calls and the reference below; a jitted call would compile them
  # into each program.
  y = module.apply(params, x, mask)
  p = _np(params["params"])
  assert set(p) == {"value", "out"}
  key = jax.random.PRNGKey(4)
  if rank == 0:
    rows = np.asarray(synthesizer_lib.fixed_random_rows(key, L, (H, 20)), np.float64)
    r = np.transpose(rows[:, :, :L], (1, 0, 2))
  else:
    key1, key2 = jax.random.split(key)
    r1, r2 = (np.asarray(synthesizer_lib.fixed_random_rows(k_, L, (H, rank)), np.float64)
              for k_ in (key1, key2))
    r = np.einsum("ihr,jhr->hij", r1, r2) / np.sqrt(rank)
  _assert_real_close(y, _synth_naive(p, x, mask, np.broadcast_to(r[None], (B, H, L, L))), mask)
  # Rows do not depend on how many are drawn, and the seed matters.
  many = np.asarray(synthesizer_lib.fixed_random_rows(key, 30, (H, 20)))
  np.testing.assert_array_equal(
      np.asarray(synthesizer_lib.fixed_random_rows(key, L, (H, 20))), many[:L])
  assert abs(many.mean()) < 0.1 and abs(many.std() - 1.0) < 0.1
  other = _build("synthesizer_random", max_length=20, trainable=False, factorized_rank=rank,
                  random_seed=5).apply(params, x, mask)
  assert not np.allclose(other, y)


@pytest.mark.parametrize("kwargs", [{"trainable": False}, {"factorized_rank": 3},
                                    {"trainable": False, "factorized_rank": 3},
                                    {"dot_product": True}])
def test_random_synthesizer_options_are_padding_invariant(kwargs):
  # Fixed rows are drawn in the call: eager calls (see _check_padding_invariance).
  _check_padding_invariance(_build("synthesizer_random", max_length=20, **kwargs),
                            jit=kwargs.get("trainable", True))


def test_random_synthesizer_init_is_lras_xavier_uniform():
  # LRA's kernel_init on [H, M, M]: fans H * M each, so U(+-sqrt(3 / (H M))).
  module = _build("synthesizer_random", max_length=20)
  r = np.asarray(init_variables(module, _inputs(), _mask(), seed=0)["params"]["random_logits"])
  bound = np.sqrt(3.0 / (H * 20))
  assert np.abs(r).max() <= bound and np.abs(r).max() > 0.9 * bound
  assert abs(r.std() - bound / np.sqrt(3.0)) < 0.1 * bound


def test_random_synthesizer_lra_bugs_pad_queries_and_no_mask():
  x, mask = _inputs(L + 7), _mask(L + 7, (L, 7))
  default = _build("synthesizer_random", max_length=20, dot_product=True)
  params = init_variables(default, x, mask)
  lra = _build("synthesizer_random", max_length=20, dot_product=True, lra_bugs=True)
  y = np.asarray(jit_apply(default)(params, x, mask))
  y_lra = np.asarray(jit_apply(lra)(params, x, mask))
  real = np.asarray(mask)
  np.testing.assert_allclose(y_lra[real], y[real], atol=1e-6)   # real queries unchanged
  # A pad query averages every value, pads included (LRA's -1e10 on query AND key).
  p = _np(params["params"])
  mean_v = _np_proj(p, "value", x).mean(axis=1, keepdims=True)
  expected = np.broadcast_to(_np_out(p, mean_v), y.shape)
  np.testing.assert_allclose(y_lra[~real], expected[~real], rtol=1e-4, atol=1e-5)
  # Without the dot product LRA applies no padding mask: the pads' content reaches real rows.
  nodot = _build("synthesizer_random", max_length=20, lra_bugs=True)
  params = init_variables(nodot, x, mask)
  y_a = np.asarray(_apply_with_pad_values(nodot, params, x, mask, 0.0))
  y_b = np.asarray(_apply_with_pad_values(nodot, params, x, mask, 55.0))
  assert not np.allclose(y_a[real], y_b[real], atol=1e-4)


@pytest.mark.parametrize("name", ["synthesizer", "synthesizer_random"])
def test_synthesizer_too_long_input_names_the_max_length_field(name):
  with pytest.raises(ValueError, match=r"model\.attention_kwargs\.max_length=10.*"
                                       r"model\.max_length \+ 1"):
    jax.eval_shape(_build(name, max_length=10).init, jax.random.PRNGKey(0), _inputs())


def test_synthesizer_option_errors():
  with pytest.raises(ValueError, match=r"model\.attention_kwargs\.factorized_rank=-1"):
    jax.eval_shape(_build("synthesizer_random", factorized_rank=-1).init, jax.random.PRNGKey(0),
                   _inputs())
  with pytest.raises(ValueError, match=r"\['trainable'\], unknown to attention 'synthesizer'"):
    _build("synthesizer", trainable=False)


@pytest.mark.parametrize("name", ["synthesizer", "synthesizer_random"])
def test_synthesizers_are_flagged_quadratic(name):
  assert attention.get(name).quadratic
  assert _quadratic_shapes(name), f"{name} should build an L x L array"


# --- Reformer (Kitaev et al., 2020; LRA's reformer_attention.py) ---------------------------

# LRA's rotation, jax.random.normal(fold_in(PRNGKey(0), 1), (16, 1, 5)) under jax 0.4.13 (the
# first two rows, printed by LRA's own code in its venv).
LRA_ROTATION_ROWS = np.array([[0.21046402, 2.7620263, -1.0005236, 1.4614954, -0.6760972],
                              [0.6792614, -0.56200176, 0.276424, 1.1766165, -0.89991933]])


_lsh_buckets = jax.jit(reformer_lib.lsh_buckets)  # one program per shape, not one per op


def _reformer_naive(p, x, mask, hashes, buckets, seed, normalize_keys=False,
                    across=True, lra_bugs=False):
  """Dense [L, L] masks per round: the n real tokens sorted by (bucket, position) and cut
  into chunks of ceil(n / buckets); a query sees its chunk and the previous one (the first
  chunk's previous is the last); self only when alone; rounds by logsumexp; heads
  concatenated, no output projection. ``lra_bugs``: 10 - L % 10 zero rows appended, every
  row real, no self-mask, logits times sqrt(K), the [H, L', K] result reshaped to
  [L', H*K] without a transpose and cut to L rows. Returns (y [B, L, E], buckets)."""
  x, mask = np.asarray(x, np.float64), np.asarray(mask)
  length = x.shape[1]
  if lra_bugs:
    x = np.pad(x, ((0, 0), (0, 10 - length % 10), (0, 0)))
    mask = np.ones(x.shape[:2], bool)
  q, v = _np_proj(p, "query", x), _np_proj(p, "value", x)
  k = q / np.sqrt(np.mean(q * q, axis=-1, keepdims=True) + 1e-6) if normalize_keys else q
  rot = reformer_lib.random_rotations(seed, K, hashes, buckets)
  bkt = np.asarray(_lsh_buckets(np.asarray(q, np.float32), mask, rot))
  b_, padded = mask.shape
  out = np.zeros((b_, H, padded, K))
  for b in range(b_):
    n = int(mask[b].sum())
    c = max(-(-n // buckets), 1)
    m = max(-(-n // c), 1)
    for h in range(H):
      outs, lses = [], []
      for r in range(hashes):
        hb = bkt[b, h, r]
        slot = np.empty(padded, int)
        slot[np.argsort(hb, kind="stable")] = np.arange(padded)
        ch = slot // c
        allowed = mask[b][None, :] & ((ch[None, :] == ch[:, None])
                                      | (ch[None, :] == (ch[:, None] - 1) % m))
        if not across:
          allowed &= hb[:, None] == hb[None, :]
        logits = q[b, :, h] @ k[b, :, h].T
        if lra_bugs:
          logits = logits * np.sqrt(K)
        else:
          logits = logits / np.sqrt(K)
          np.fill_diagonal(logits, -1e5)
        logits = np.where(allowed, logits, -1e30)   # pad query rows stay finite
        lse = _np_lse(logits, -1)
        outs.append(np.exp(logits - lse) @ v[b, :, h])
        lses.append(lse[:, 0])
      lses = np.stack(lses)                                    # [R, L]
      w = np.exp(lses - _np_lse(lses, 0))
      out[b, h] = np.einsum("rl,rlk->lk", w, np.stack(outs))
  if lra_bugs:
    return out.reshape(b_, padded, H * K)[:, :length], bkt
  y = np.transpose(out, (0, 2, 1, 3)).reshape(b_, padded, H * K)
  return np.where(mask[..., None], y, 0.0), bkt


@pytest.mark.parametrize("hashes,buckets,pad,options", [
    (2, 4, 7, {}),
    (3, 6, 0, {"normalize_keys": True, "attend_across_buckets": False}),
    (1, 4, 5, {"lra_bugs": True}),      # 17 tokens + 3 zero rows: chunks of 5
    (1, 10, 8, {"lra_bugs": True}),     # 20 tokens + a whole 10 zero rows
])
def test_reformer_equals_dense_masked_reference(hashes, buckets, pad, options):
  module = _build("reformer", num_hashes=hashes, num_buckets=buckets, hash_seed=3, **options)
  x, mask = _inputs(L + pad), _mask(L + pad, (L, 7))
  params = init_variables(module, x, mask)
  y, state = _apply_sown(module, params, x, mask)
  naive, bkt = _reformer_naive(_np(params["params"]), x, mask, hashes, buckets, 3, **{
      "normalize_keys": options.get("normalize_keys", False),
      "across": options.get("attend_across_buckets", True),
      "lra_bugs": options.get("lra_bugs", False)})
  (sown,) = state["intermediates"]["buckets_BxHxRxL"]
  np.testing.assert_array_equal(np.asarray(sown), bkt)
  assert len(np.unique(bkt)) > 1
  if options.get("lra_bugs"):       # every row is real, pads and zero rows included
    assert np.all(bkt < buckets)
    np.testing.assert_allclose(np.asarray(y), naive, rtol=1e-4, atol=1e-5)
    return
  real = np.asarray(mask)
  assert np.all(bkt[np.broadcast_to(~real[:, None, None], bkt.shape)] == buckets)
  assert np.all(bkt[np.broadcast_to(real[:, None, None], bkt.shape)] < buckets)
  np.testing.assert_allclose(np.asarray(y), naive, rtol=1e-4, atol=1e-5)  # pad rows are 0


def test_reformer_hash_is_deterministic_for_a_fixed_seed():
  rot = reformer_lib.random_rotations(0, K, 2, 4)
  chex.assert_shape(rot, (K, 2, 2))                          # no length or head axis
  np.testing.assert_array_equal(rot, reformer_lib.random_rotations(0, K, 2, 4))
  assert not np.allclose(rot, reformer_lib.random_rotations(1, K, 2, 4))
  # LRA's values (its jax 0.4 threefry bits), whatever the installed jax's default.
  np.testing.assert_allclose(np.asarray(reformer_lib.random_rotations(0, 16, 1, 10))[:2, 0],
                             LRA_ROTATION_ROWS, rtol=1e-6)
  x, mask = np.asarray(_inputs()).reshape(B, L, H, K), _mask()  # numpy: no compiles
  a = _lsh_buckets(x, mask, rot)
  np.testing.assert_array_equal(a, jax.jit(reformer_lib.lsh_buckets)(x, mask, rot))  # retraced
  chex.assert_shape(a, (B, H, 2, L))
  # Angular: scaling a vector does not change its bucket.
  np.testing.assert_array_equal(a, _lsh_buckets(3.0 * x, mask, rot))
  # Two separately built modules, each traced under its own jit, hash the same way. (Not
  # jit_apply: it would share one traced program between the two equal modules.)
  x2 = _inputs()
  modules = [_build("reformer", num_hashes=2, num_buckets=4) for _ in range(2)]
  params = init_variables(modules[0], x2, mask)
  runs = [jax.jit(lambda p, x, m, module=module: module.apply(
      p, x, m, mutable=["intermediates"])[1])(params, x2, mask) for module in modules]
  np.testing.assert_array_equal(*(r["intermediates"]["buckets_BxHxRxL"][0] for r in runs))


def test_reformer_is_padding_invariant_with_small_chunks():
  # Two rounds, 4 buckets: 12 and 9 real tokens give chunks of 3 (4 and 3 chunks) whatever
  # the padded length. (The default options are checked in test_attention.py.)
  _check_padding_invariance(_build("reformer", num_hashes=2, num_buckets=4))


def test_reformer_lra_bugs_depend_on_padding():
  # LRA's function reads no mask: pads are keys and the chunks follow the padded length.
  with pytest.raises(AssertionError):
    _check_padding_invariance(_build("reformer", num_buckets=4, lra_bugs=True))


def test_reformer_token_alone_attends_to_itself():
  # One real token: its only key is itself, so its output is value(x_0), heads concatenated.
  module = _build("reformer", num_hashes=2, num_buckets=4)
  x, mask = _inputs(), _mask(L, (1, 1))
  params, y = _apply(module, x, mask)
  p = _np(params["params"])
  expected = _np_proj(p, "value", x).reshape(B, L, E)
  np.testing.assert_allclose(np.asarray(y)[:, 0], expected[:, 0], rtol=1e-5, atol=1e-5)
  assert set(params["params"]) == {"query", "value"}          # shared QK, no output projection


@pytest.mark.parametrize("kwargs,match", [
    ({"num_buckets": 5}, r"model\.attention_kwargs\.num_buckets=5"),
    ({"num_buckets": 0}, r"model\.attention_kwargs\.num_buckets=0"),
    ({"num_hashes": 0}, r"model\.attention_kwargs\.num_hashes=0"),
    ({"out_dim": 8}, r"model\.qkv_dim \(16\) must equal model\.emb_dim \(8\)"),
])
def test_reformer_errors_name_the_field(kwargs, match):
  build = dict(num_heads=H, qkv_dim=E, out_dim=E, dropout_rate=0.0, dtype=jnp.float32)
  module = attention.get("reformer").build(**{**build, **kwargs})
  with pytest.raises(ValueError, match=match):
    jax.eval_shape(module.init, jax.random.PRNGKey(0), _inputs())


@pytest.mark.parametrize("name,kwargs", [
    ("reformer", {"num_hashes": 2, "num_buckets": 16}),
    ("sinkhorn", {"block_size": 32}),
])
def test_no_length_squared_intermediate_with_other_options(name, kwargs):
  assert _quadratic_shapes(name, **kwargs) == []
