"""Linear, Performer, AFT and Linformer attention: equivalence with naive quadratic forms
written out here, causality, causal padding invariance, the random features, errors,
and a memory test (no sub-quadratic variant builds an ``L x L`` intermediate).

Shapes: B=2, L=12, E=16, H=4 (per-head width 4), as in test_attention.py. Shape
and padding-invariance tests for every registered name are in test_attention.py
and test_models.py.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simpletron_jax.model import attention
from simpletron_jax.model.attention import performer as performer_lib
from tests.module_support import init_variables, jit_apply
from tests.test_attention import _build, _proj  # same shapes (B, L, E, H) as this file

B, L, E, H = 2, 12, 16, 4
K = E // H


def _inputs(length=L, seed=0, width=E):
  return jax.random.normal(jax.random.PRNGKey(seed), (B, length, width))


def _mask(length=L, lengths=(L, 9)):
  return np.arange(length)[None, :] < np.array(lengths)[:, None]  # numpy: no compile


# Compiles: the tests take the parameters from ``init_variables`` and call the module
# through ``jit_apply`` (tests/module_support.py).

def _qkv(p, x):
  return tuple(_proj(p, n, x) for n in ("query", "key", "value"))


def _out(p, heads_BxLxHxK):
  return jnp.einsum("blhk,hko->blo", heads_BxLxHxK, p["out"]["kernel"]) + p["out"]["bias"]


def _assert_real_close(y, naive, mask, rtol=1e-5, atol=1e-5):
  real = np.asarray(mask)
  chex.assert_equal_shape([y, naive])
  np.testing.assert_allclose(np.asarray(y)[real], np.asarray(naive)[real], rtol=rtol, atol=atol)


def _kernel_attention_naive(phi_q, phi_k, v, mask, causal=False):
  """Explicit [B, H, L, L] normalised kernel attention: A_ij = phi(q_i).phi(k_j)."""
  a_BxHxLxL = jnp.einsum("bihm,bjhm->bhij", phi_q, phi_k)
  keep = mask[:, None, None, :]
  if causal:
    keep = keep & jnp.tril(jnp.ones((phi_q.shape[1],) * 2, bool))[None, None]
  a_BxHxLxL = jnp.where(keep, a_BxHxLxL, 0.0)
  a_BxHxLxL = a_BxHxLxL / a_BxHxLxL.sum(axis=-1, keepdims=True)
  return jnp.einsum("bhij,bjhd->bihd", a_BxHxLxL, v)


def _check_causality(module, cut=7):
  x = np.asarray(_inputs())
  x_changed = x.copy()
  x_changed[:, cut:] = np.asarray(jax.random.normal(jax.random.PRNGKey(9), (B, L - cut, E)))
  params = init_variables(module, x)
  y, y_changed = jit_apply(module)(params, x), jit_apply(module)(params, x_changed)
  np.testing.assert_allclose(np.asarray(y_changed)[:, :cut], np.asarray(y)[:, :cut],
                             rtol=1e-5, atol=1e-5)
  assert not np.allclose(np.asarray(y_changed)[:, cut:], np.asarray(y)[:, cut:])


def _check_padding_invariance(module, pads=7, jit=True):
  """``jit=False``: eager calls, for a module that draws random numbers in its call (each
  program would compile the draws again; eager calls share them)."""
  apply = jit_apply(module) if jit else module.apply
  x, mask = _inputs(), _mask()
  params = init_variables(module, x, mask)
  y = apply(params, x, mask)
  # The padded input in numpy (float32, the same values): no compiles.
  x_padded = np.concatenate([np.asarray(x), 100.0 * np.asarray(_inputs(pads, seed=3))], axis=1)
  mask_padded = np.concatenate([mask, np.zeros((B, pads), bool)], axis=1)
  x_padded = np.where(mask_padded[..., None], x_padded, np.float32(55.0))
  y_padded = apply(params, x_padded, mask_padded)
  _assert_real_close(y_padded[:, :L], y, mask)


# --- Linear attention (Katharopoulos et al., 2020) ---------------------------------------

def _phi(x):
  return jnp.where(x > 0, x + 1.0, jnp.exp(x))  # elu(x) + 1, written out


@functools.partial(jax.jit, static_argnames="causal")  # one program per shape, not per op
def _linear_naive(p, x, mask, causal=False):
  q, k, v = _qkv(p, x)
  return _out(p, _kernel_attention_naive(_phi(q), _phi(k), v, mask, causal=causal))


@pytest.mark.parametrize("pad", [0, 7])
def test_linear_equals_naive_quadratic_form(pad):
  module = _build("linear")
  x, mask = _inputs(L + pad), _mask(L + pad, (L, L - 4))
  params = init_variables(module, x, mask)
  y = jit_apply(module)(params, x, mask)
  naive = _linear_naive(params["params"], x, mask)
  _assert_real_close(y, naive, mask)


@pytest.mark.parametrize("chunk_size", [1, 5, 12, 64])
def test_causal_linear_equals_naive_lower_triangular_form(chunk_size):
  module = _build("linear", causal=True, chunk_size=chunk_size)
  x, mask = _inputs(), _mask()
  params = init_variables(module, x, mask)
  y = jit_apply(module)(params, x, mask)
  naive = _linear_naive(params["params"], x, mask, causal=True)
  _assert_real_close(y, naive, mask)


# --- Performer (Choromanski et al., 2021) ------------------------------------------------

def _performer_features(kernel, x_BxLxHxK, w_MxK):
  if kernel == "softmax":
    x = x_BxLxHxK / K ** 0.25
    wx = jnp.einsum("blhk,mk->blhm", x, w_MxK)
    return jnp.exp(wx - 0.5 * jnp.sum(x * x, -1, keepdims=True)) / np.sqrt(w_MxK.shape[0])
  if kernel == "relu":
    return jax.nn.relu(jnp.einsum("blhk,mk->blhm", x_BxLxHxK, w_MxK)) + 1e-3
  return jax.nn.relu(x_BxLxHxK) + 1e-3


@functools.partial(jax.jit, static_argnames="kernel")  # one program per kernel, not per op
def _performer_naive(p, x, mask, w, kernel):
  q, k, v = _qkv(p, x)
  return _out(p, _kernel_attention_naive(_performer_features(kernel, q, w),
                                         _performer_features(kernel, k, w), v, mask))


@pytest.mark.parametrize("kernel", ["softmax", "relu", "relu_deterministic"])
def test_performer_with_fixed_features_equals_naive_quadratic_form(kernel):
  module = _build("performer", kernel=kernel, num_features=10, softmax_eps=0.0)
  x, mask = _inputs(), _mask()
  params = init_variables(module, x, mask)
  y, state = jit_apply(module, sown=True)(params, x, mask)
  if kernel == "relu_deterministic":
    assert "intermediates" not in state or not state["intermediates"]
    w = None
  else:
    (w,) = state["intermediates"]["projection_MxK"]
    chex.assert_shape(w, (10, K))
  naive = _performer_naive(params["params"], x, mask, w, kernel)
  _assert_real_close(y, naive, mask, rtol=1e-4)


def test_performer_softmax_kernel_approaches_softmax_attention():
  # The variance of positive random features grows like exp(|q|^2 + |k|^2) (Performer
  # paper's MSE analysis), so inputs are halved to keep the per-head norms moderate; there the
  # error falls about as 1/sqrt(M).
  x, mask = 0.5 * np.asarray(_inputs()), _mask()  # numpy: the same float32 values
  exact_module = _build("softmax")
  params = init_variables(exact_module, x, mask)  # same parameter names
  exact = np.asarray(jit_apply(exact_module)(params, x, mask))
  real = np.asarray(mask)

  def error(num_features):
    errs = [np.abs(np.asarray(jit_apply(_build("performer", num_features=num_features,
                                                feature_seed=s))(params, x, mask))
                   - exact)[real].mean() for s in range(3)]
    return float(np.mean(errs))

  err_10, err_256, err_4096 = error(10), error(256), error(4096)
  assert err_10 > err_256 > err_4096, (err_10, err_256, err_4096)
  assert err_4096 < 0.25 * err_10, (err_10, err_4096)
  assert err_4096 < 0.1 * np.abs(exact[real]).mean(), err_4096


def test_orthogonal_random_matrix_blocks_and_reproducibility():
  key = jax.random.PRNGKey(3)
  w = performer_lib.gaussian_orthogonal_random_matrix(key, 10, 4)
  chex.assert_shape(w, (10, 4))
  np.testing.assert_array_equal(w, performer_lib.gaussian_orthogonal_random_matrix(key, 10, 4))
  w = np.asarray(w)  # the Gram matrices in numpy (float32): no compiles
  for block in (w[0:4], w[4:8], w[8:10]):
    gram = block @ block.T
    np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0.0, atol=1e-5)
  with pytest.raises(ValueError, match="num_features"):
    performer_lib.gaussian_orthogonal_random_matrix(key, 0, 4)


def test_performer_redraw_uses_the_random_features_rng():
  x, mask = _inputs(), _mask()
  fixed, redraw = _build("performer"), _build("performer", redraw=True)
  params = init_variables(fixed, x, mask)
  y_fixed = jit_apply(fixed)(params, x, mask)

  @jax.jit  # every call in one program, not one per op; the rngs are arguments
  def run(params, key_a, key_b, key_c):
    train = lambda key: redraw.apply(params, x, mask, deterministic=False,  # noqa: E731
                                     rngs={"random_features": key})
    return (redraw.apply(params, x, mask), redraw.apply(params, x, mask, deterministic=False),
            redraw.apply(params, x, mask, rngs={"random_features": key_a}),
            train(key_a), train(key_b), train(key_c),
            _build("performer", feature_seed=1).apply(params, x, mask))

  y_eval, y_no_rng, y_eval_rng, y_a, y_b, y_a_again, other = run(
      params, jax.random.PRNGKey(5), jax.random.PRNGKey(6), jax.random.PRNGKey(5))
  # Deterministic mode, or no "random_features" rng: the fixed matrix.
  np.testing.assert_array_equal(y_eval, y_fixed)
  np.testing.assert_array_equal(y_no_rng, y_fixed)
  np.testing.assert_array_equal(y_eval_rng, y_fixed)
  # Training mode with the rng (seeds 5 and 6): a redrawn matrix, the same for the same seed.
  assert not np.allclose(y_a, y_fixed) and not np.allclose(y_a, y_b)
  np.testing.assert_array_equal(y_a, y_a_again)
  # The fixed matrix depends on feature_seed only.
  assert not np.allclose(other, y_fixed)


@pytest.mark.parametrize("kernel", ["relu", "relu_deterministic"])
def test_performer_relu_kernels_are_padding_invariant(kernel):
  _check_padding_invariance(_build("performer", kernel=kernel))


def test_performer_softmax_default_is_padding_invariant():
  _check_padding_invariance(_build("performer", num_features=6))


def test_lra_orthogonal_random_matrix_is_lras_construction():
  key = jax.random.PRNGKey(7)
  w = performer_lib.lra_orthogonal_random_matrix(key, 10, 4)
  chex.assert_shape(w, (10, 4))
  with jax.threefry_partitionable(False):  # LRA's draw_weights: all from the first split
    k0, _ = jax.random.split(key)
    norms = np.linalg.norm(np.asarray(jax.random.normal(k0, (10, 4))), axis=1)
  w = np.asarray(w)  # the norms and Gram matrices in numpy (float32): no compiles
  np.testing.assert_allclose(np.linalg.norm(w, axis=1), norms, rtol=1e-5)
  for block in (w[0:4], w[4:8], w[8:10]):
    gram = block @ block.T
    np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0.0, atol=1e-4)
  with pytest.raises(ValueError, match="num_features"):
    performer_lib.lra_orthogonal_random_matrix(key, 0, 4)


def test_performer_lra_bugs_draws_features_from_the_query_sum_every_call():
  x, mask = np.asarray(_inputs()), _mask()
  x_other = x.copy()  # numpy: no compile
  x_other[1] = np.asarray(_inputs(seed=4))[1]
  lra = _build("performer", num_features=2, lra_bugs=True)
  fixed = _build("performer", num_features=2)
  params = init_variables(lra, x, mask)

  @jax.jit  # one program, not one per op
  def run(params, x, x_other, key):
    y, state = lra.apply(params, x, mask, mutable=["intermediates"])
    q = _proj(params["params"], "query", x)
    want = performer_lib.lra_orthogonal_random_matrix(performer_lib.lra_query_seed_key(q), 2, K)
    y_train = lra.apply(params, x, mask, deterministic=False, rngs={"random_features": key})
    return (y, state, want, y_train, fixed.apply(params, x_other, mask),
            fixed.apply(params, x, mask), lra.apply(params, x_other, mask))

  y, state, want, y_train, fixed_other, fixed_y, lra_other = run(params, x, x_other,
                                                                 jax.random.PRNGKey(3))
  np.testing.assert_allclose(state["intermediates"]["projection_MxK"][0], want, rtol=1e-6)
  # The same in training mode, with or without an rng: no "redraw" rng is used.
  np.testing.assert_array_equal(y_train, y)
  # Example 0's output depends on example 1 (the seed sums the whole batch) and on pads;
  # with the default fixed features it depends on neither.
  np.testing.assert_allclose(fixed_other[0], fixed_y[0], rtol=1e-6, atol=1e-6)
  assert not np.allclose(lra_other[0], y[0], atol=1e-4)
  with pytest.raises(AssertionError):
    _check_padding_invariance(_build("performer", num_features=2, lra_bugs=True))


def test_performer_lra_bugs_leaves_the_relu_kernel_unchanged():
  x, mask = _inputs(), _mask()
  module = _build("performer", kernel="relu_deterministic")
  params = init_variables(module, x, mask)
  lra = _build("performer", kernel="relu_deterministic", lra_bugs=True)
  np.testing.assert_array_equal(jit_apply(lra)(params, x, mask),
                                jit_apply(module)(params, x, mask))


def test_feature_attention_small_denominator_guard():
  phi_q = np.full((1, 2, 1, 1), 1e-4, np.float32)
  phi_k = np.full((1, 2, 1, 1), 1e-4, np.float32)   # den = 2e-8 <= 1e-6: 2e-6 is added
  v = np.ones((1, 2, 1, 3), np.float32)
  mask = np.ones((1, 2), bool)

  @jax.jit  # both forms in one program, not one per op
  def run(phi_q, phi_k, v, mask):
    return (performer_lib.normalized_feature_attention(phi_q, phi_k, v, mask, eps=0.0),
            performer_lib.normalized_feature_attention(phi_q, phi_k, v, mask, eps=0.0,
                                                       small_den=1e-6))

  plain, guarded = run(phi_q, phi_k, v, mask)
  np.testing.assert_allclose(plain, 1.0, rtol=1e-5)
  np.testing.assert_allclose(guarded, 2e-8 / (2e-8 + 2e-6), rtol=1e-4)


def test_performer_unknown_kernel_is_a_clear_error():
  with pytest.raises(ValueError, match=r"unknown performer kernel 'cos'.*attention_kwargs\.kernel"):
    _build("performer", kernel="cos").init(jax.random.PRNGKey(0), _inputs())


# --- AFT (Zhai et al., 2021) ---------------------------------------------------------------

def _aft_params(module, x, mask, name, scale=1.0, shift=0.0):
  params = init_variables(module, x, mask)
  p = dict(params["params"])
  if name in ("aft_full", "aft_local"):
    field = "pos_bias" if name == "aft_full" else "pos_bias_band"
    # The shift and scale in numpy (float32): no compiles.
    p[field] = shift + scale * np.asarray(jax.random.normal(jax.random.PRNGKey(7),
                                                            p[field].shape))
  return {"params": p}


def _aft_dense_w(name, p, length, window):
  """The paper's [T, T] position bias w."""
  w = np.zeros((length, length))
  if name == "aft_full":
    w = np.asarray(p["pos_bias"], np.float64)[:length, :length]
  elif name == "aft_local":
    band = np.asarray(p["pos_bias_band"], np.float64)
    for t in range(length):
      for t2 in range(length):
        if abs(t - t2) < window:
          w[t, t2] = band[t, t2 - t + window - 1]
  return w


def _aft_naive(p, x, mask, w_TxT, causal, activation="sigmoid"):
  """Y_t = sigma_q(Q_t) * sum_t' exp(K_t' + w_tt') V_t' / sum_t' exp(K_t' + w_tt'), float64."""
  x64 = np.asarray(x, np.float64)
  q, k, v = (np.einsum("ble,ehk->blhk", x64, np.asarray(p[n]["kernel"], np.float64))
             + np.asarray(p[n]["bias"], np.float64) for n in ("query", "key", "value"))
  b, t = x.shape[:2]
  q, k, v = q.reshape(b, t, E), k.reshape(b, t, E), v.reshape(b, t, E)
  allowed_BxTxT = np.asarray(mask)[:, None, :] & np.ones((t, t), bool)[None]
  if causal:
    allowed_BxTxT = allowed_BxTxT & np.tril(np.ones((t, t), bool))[None]
  e_BxTxTxD = np.exp(k[:, None, :, :] + w_TxT[None, :, :, None]) * allowed_BxTxT[..., None]
  num = (e_BxTxTxD * v[:, None, :, :]).sum(axis=2)
  den = e_BxTxTxD.sum(axis=2)
  gate = 1.0 / (1.0 + np.exp(-q)) if activation == "sigmoid" else np.maximum(q, 0.0)
  y = gate * num / np.where(den == 0, 1.0, den)
  kernel = np.asarray(p["out"]["kernel"], np.float64).reshape(E, E)
  return y @ kernel + np.asarray(p["out"]["bias"], np.float64)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name,window", [("aft_simple", None), ("aft_full", None),
                                         ("aft_local", 1), ("aft_local", 5),
                                         ("aft_local", 20)])
def test_aft_equals_paper_formula(name, window, causal):
  kwargs = {"causal": causal, "max_length": 16}
  if window is not None:
    kwargs["window"] = window
  module = _build(name, **kwargs)
  x, mask = _inputs(), _mask()
  params = _aft_params(module, x, mask, name)
  y = jit_apply(module)(params, x, mask)
  p = params["params"]
  naive = _aft_naive(p, x, mask, _aft_dense_w(name, p, L, window), causal)
  _assert_real_close(y, naive, mask)


@pytest.mark.parametrize("name,window,scale", [("aft_simple", 3, 30.0), ("aft_full", 3, 30.0),
                                               ("aft_local", 20, 30.0), ("aft_local", 3, 8.0)])
def test_aft_is_stable_for_large_keys_and_biases(name, window, scale):
  # Keys of size ~100 and biases of +200: exp overflows in float32 without the
  # stabilisers. (With a small window and keys spread by >100 the in-window terms of
  # AFT-local can underflow against the global key maximum, hence the smaller scale.)
  module = _build(name, window=window, max_length=16, activation="relu")
  x, mask = scale * np.asarray(_inputs()), _mask()  # numpy: the same float32 values
  params = _aft_params(module, x, mask, name, shift=200.0)
  y = jit_apply(module)(params, x, mask)
  chex.assert_tree_all_finite(y)
  p = params["params"]
  naive = _aft_naive(p, x, mask, _aft_dense_w(name, p, L, window), False, activation="relu")
  _assert_real_close(y, naive, mask, rtol=1e-4, atol=1e-3)


def test_aft_params_and_registry():
  x = _inputs()
  full = init_variables(_build("aft_full", max_length=16), x, seed=0)["params"]
  local = init_variables(_build("aft_local", max_length=16, window=3), x, seed=0)["params"]
  simple = init_variables(_build("aft_simple"), x, seed=0)["params"]
  chex.assert_shape(full["pos_bias"], (16, 16))
  chex.assert_shape(local["pos_bias_band"], (16, 5))
  assert set(simple) == {"query", "key", "value", "out"}
  assert attention.get("aft_full").quadratic and not attention.get("aft_local").quadratic


@pytest.mark.parametrize("name", ["aft_full", "aft_local", "linformer"])
def test_too_long_input_names_the_max_length_field(name):
  module = _build(name, max_length=10)
  with pytest.raises(ValueError, match=r"model\.attention_kwargs\.max_length=10.*"
                                       r"model\.max_length \+ 1"):
    module.init(jax.random.PRNGKey(0), _inputs())


def test_aft_unknown_activation_is_a_clear_error():
  with pytest.raises(ValueError, match=r"attention_kwargs\.activation"):
    _build("aft_simple", activation="tanh").init(jax.random.PRNGKey(0), _inputs())


# --- Linformer (Wang et al., 2020) -------------------------------------------------------

@functools.partial(jax.jit, static_argnames="share_kv")  # one program, not one per op
def _linformer_dense(p, x, mask, share_kv):
  q, k, v = _qkv(p, x)
  m = mask[:, :, None, None]
  e_LxR = p["proj_E"][:x.shape[1]]
  f_LxR = e_LxR if share_kv else p["proj_F"][:x.shape[1]]
  k_proj = jnp.einsum("lr,blhd->brhd", e_LxR, k * m)   # E^T K, pads zeroed first
  v_proj = jnp.einsum("lr,blhd->brhd", f_LxR, v * m)   # E^T V (or F^T V)
  logits = jnp.einsum("bihd,brhd->bhir", q, k_proj) / np.sqrt(K)
  return _out(p, jnp.einsum("bhir,brhd->bihd", jax.nn.softmax(logits, -1), v_proj))


@pytest.mark.parametrize("share_kv", [True, False])
@pytest.mark.parametrize("pad", [0, 7])
def test_linformer_equals_dense_form(pad, share_kv):
  module = _build("linformer", k=6, max_length=20, share_kv=share_kv)
  x, mask = _inputs(L + pad), _mask(L + pad, (L, L - 4))
  params = init_variables(module, x, mask)
  y = jit_apply(module)(params, x, mask)
  p = params["params"]
  naive = _linformer_dense(p, x, mask, share_kv)
  _assert_real_close(y, naive, mask)
  assert ("proj_F" in p) == (not share_kv)


def test_linformer_projection_has_lras_xavier_uniform_init():
  p = init_variables(_build("linformer", k=16, max_length=150), _inputs(), seed=0)["params"]
  e = np.asarray(p["proj_E"])
  bound = np.sqrt(6.0 / (150 + 16))   # LRA's lr_kernel: xavier_uniform on [max_len, k]
  assert e.shape == (150, 16) and e.dtype == np.float32
  assert np.abs(e).max() <= bound and np.abs(e).max() > 0.9 * bound
  np.testing.assert_allclose(e.std(), bound / np.sqrt(3.0), rtol=0.05)


def test_linformer_separate_value_projection_is_padding_invariant():
  _check_padding_invariance(_build("linformer", k=6, max_length=20, share_kv=False))


# --- Causal forms: causality and padding invariance --------------------------------------

CAUSAL_FORMS = [
    ("linear", {"chunk_size": 5}),
    ("aft_simple", {}),
    ("aft_full", {"max_length": 16}),
    ("aft_local", {"window": 3, "max_length": 16}),
    ("aft_local", {"window": 20, "max_length": 16}),
]


@pytest.mark.parametrize("name,kwargs", CAUSAL_FORMS)
def test_causality(name, kwargs):
  _check_causality(_build(name, causal=True, **kwargs))


@pytest.mark.parametrize("name,kwargs", CAUSAL_FORMS)
def test_causal_padding_invariance(name, kwargs):
  # test_attention.py's causal padding test only covers softmax and simple*.
  kwargs = dict(kwargs, max_length=24) if "max_length" in kwargs else kwargs
  _check_padding_invariance(_build(name, causal=True, **kwargs))


# --- Memory: no L x L intermediate in sub-quadratic variants -----------------------------

MEM_L, MEM_E, MEM_H = 2048, 32, 8  # per-head width 4, as in the other tests


def _sub_jaxprs(param):
  if hasattr(param, "eqns"):                                   # Jaxpr
    yield param
  elif hasattr(param, "jaxpr") and hasattr(param.jaxpr, "eqns"):  # ClosedJaxpr
    yield param.jaxpr
  elif isinstance(param, (tuple, list)):
    for item in param:
      yield from _sub_jaxprs(item)


def _all_shapes(jaxpr):
  for var in list(jaxpr.invars) + list(jaxpr.constvars):
    yield getattr(var.aval, "shape", ())
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      yield getattr(var.aval, "shape", ())
    for param in eqn.params.values():
      for sub in _sub_jaxprs(param):
        yield from _all_shapes(sub)


def _quadratic_shapes(name, **kwargs):
  """Shapes in the forward pass's jaxpr (sub-jaxprs included) with two axes >= L."""
  module = attention.get(name).build(num_heads=MEM_H, qkv_dim=MEM_E, out_dim=MEM_E,
                                     dropout_rate=0.0, dtype=jnp.float32, **kwargs)
  x = jax.ShapeDtypeStruct((1, MEM_L, MEM_E), jnp.float32)
  mask = jax.ShapeDtypeStruct((1, MEM_L), jnp.bool_)
  params = jax.eval_shape(module.init, jax.random.PRNGKey(0), x, mask)
  jaxpr = jax.make_jaxpr(lambda p, x, m: module.apply(p, x, m))(params, x, mask).jaxpr
  return sorted({s for s in _all_shapes(jaxpr) if sum(d >= MEM_L for d in s) >= 2})


SUBQUADRATIC = ([(name, {}) for name in attention.names() if not attention.get(name).quadratic]
                + [("simple", {"causal": True}), ("linear", {"causal": True}),
                   ("aft_simple", {"causal": True}), ("aft_local", {"causal": True}),
                   ("performer", {"kernel": "relu"}),
                   ("performer", {"kernel": "relu_deterministic"})])


@pytest.mark.parametrize("name,kwargs", SUBQUADRATIC)
def test_no_length_squared_intermediate(name, kwargs):
  assert _quadratic_shapes(name, **kwargs) == []


@pytest.mark.parametrize("name", ["softmax", "aft_full"])
def test_memory_check_flags_quadratic_variants(name):
  assert attention.get(name).quadratic
  assert _quadratic_shapes(name), f"{name} should build an L x L array"


def test_only_softmax_aft_full_and_synthesizers_are_quadratic():
  quadratic = {n for n in attention.names() if attention.get(n).quadratic}
  assert quadratic == {"softmax", "aft_full", "synthesizer", "synthesizer_random"}
