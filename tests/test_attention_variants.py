"""Linear, Performer, AFT and Linformer attention: equivalence with naive quadratic forms
written out here, causality, causal padding invariance, the random features, errors,
and a memory test (no sub-quadratic variant builds an ``L x L`` intermediate).

Shapes: B=2, L=12, E=16, H=4 (per-head width 4), as in test_attention.py. Shape
and padding-invariance tests for every registered name are in test_attention.py
and test_models.py.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simpletron_jax.model import attention
from simpletron_jax.model.attention import performer as performer_lib
from tests.test_attention import _build, _proj  # same shapes (B, L, E, H) as this file

B, L, E, H = 2, 12, 16, 4
K = E // H


def _inputs(length=L, seed=0, width=E):
  return jax.random.normal(jax.random.PRNGKey(seed), (B, length, width))


def _mask(length=L, lengths=(L, 9)):
  return jnp.arange(length)[None, :] < jnp.array(lengths)[:, None]




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
  x = _inputs()
  params = module.init(jax.random.PRNGKey(1), x)
  x_changed = x.at[:, cut:].set(jax.random.normal(jax.random.PRNGKey(9), (B, L - cut, E)))
  y, y_changed = module.apply(params, x), module.apply(params, x_changed)
  np.testing.assert_allclose(np.asarray(y_changed)[:, :cut], np.asarray(y)[:, :cut],
                             rtol=1e-5, atol=1e-5)
  assert not np.allclose(np.asarray(y_changed)[:, cut:], np.asarray(y)[:, cut:])


def _check_padding_invariance(module, pads=7):
  x, mask = _inputs(), _mask()
  params = module.init(jax.random.PRNGKey(1), x, mask)
  y = module.apply(params, x, mask)
  x_padded = jnp.concatenate([x, 100.0 * _inputs(pads, seed=3)], axis=1)
  mask_padded = jnp.concatenate([mask, jnp.zeros((B, pads), bool)], axis=1)
  x_padded = jnp.where(mask_padded[..., None], x_padded, 55.0)
  y_padded = module.apply(params, x_padded, mask_padded)
  _assert_real_close(y_padded[:, :L], y, mask)


# --- Linear attention (Katharopoulos et al., 2020) ---------------------------------------

def _phi(x):
  return jnp.where(x > 0, x + 1.0, jnp.exp(x))  # elu(x) + 1, written out


@pytest.mark.parametrize("pad", [0, 7])
def test_linear_equals_naive_quadratic_form(pad):
  module = _build("linear")
  x, mask = _inputs(L + pad), _mask(L + pad, (L, L - 4))
  params = module.init(jax.random.PRNGKey(1), x, mask)
  y = module.apply(params, x, mask)
  p = params["params"]
  q, k, v = _qkv(p, x)
  naive = _out(p, _kernel_attention_naive(_phi(q), _phi(k), v, mask))
  _assert_real_close(y, naive, mask)


@pytest.mark.parametrize("chunk_size", [1, 5, 12, 64])
def test_causal_linear_equals_naive_lower_triangular_form(chunk_size):
  module = _build("linear", causal=True, chunk_size=chunk_size)
  x, mask = _inputs(), _mask()
  params = module.init(jax.random.PRNGKey(1), x, mask)
  y = module.apply(params, x, mask)
  p = params["params"]
  q, k, v = _qkv(p, x)
  naive = _out(p, _kernel_attention_naive(_phi(q), _phi(k), v, mask, causal=True))
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


@pytest.mark.parametrize("kernel", ["softmax", "relu", "relu_deterministic"])
def test_performer_with_fixed_features_equals_naive_quadratic_form(kernel):
  module = _build("performer", kernel=kernel, num_features=10, softmax_eps=0.0)
  x, mask = _inputs(), _mask()
  params = module.init(jax.random.PRNGKey(1), x, mask)
  y, state = module.apply(params, x, mask, mutable=["intermediates"])
  p = params["params"]
  if kernel == "relu_deterministic":
    assert "intermediates" not in state or not state["intermediates"]
    w = None
  else:
    (w,) = state["intermediates"]["projection_MxK"]
    chex.assert_shape(w, (10, K))
  q, k, v = _qkv(p, x)
  naive = _out(p, _kernel_attention_naive(_performer_features(kernel, q, w),
                                          _performer_features(kernel, k, w), v, mask))
  _assert_real_close(y, naive, mask, rtol=1e-4)


def test_performer_softmax_kernel_approaches_softmax_attention():
  # The variance of positive random features grows like exp(|q|^2 + |k|^2) (Performer
  # paper's MSE analysis), so inputs are halved to keep the per-head norms moderate; there the
  # error falls about as 1/sqrt(M). (M = 10 and 256 share compilations with other tests.)
  x, mask = 0.5 * _inputs(), _mask()
  exact_module = _build("softmax")
  params = exact_module.init(jax.random.PRNGKey(1), x, mask)  # same parameter names
  exact = np.asarray(exact_module.apply(params, x, mask))
  real = np.asarray(mask)

  def error(num_features):
    errs = [np.abs(np.asarray(_build("performer", num_features=num_features, feature_seed=s)
                              .apply(params, x, mask)) - exact)[real].mean() for s in range(3)]
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
  for block in (w[0:4], w[4:8], w[8:10]):
    gram = np.asarray(block @ block.T)
    np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0.0, atol=1e-5)
  with pytest.raises(ValueError, match="num_features"):
    performer_lib.gaussian_orthogonal_random_matrix(key, 0, 4)


def test_performer_redraw_uses_the_random_features_rng():
  x, mask = _inputs(), _mask()
  fixed, redraw = _build("performer"), _build("performer", redraw=True)
  params = fixed.init(jax.random.PRNGKey(1), x, mask)
  y_fixed = fixed.apply(params, x, mask)
  # Deterministic mode, or no "random_features" rng: the fixed matrix.
  np.testing.assert_array_equal(redraw.apply(params, x, mask), y_fixed)
  np.testing.assert_array_equal(redraw.apply(params, x, mask, deterministic=False), y_fixed)
  np.testing.assert_array_equal(
      redraw.apply(params, x, mask, rngs={"random_features": jax.random.PRNGKey(5)}), y_fixed)

  def train(seed):
    return redraw.apply(params, x, mask, deterministic=False,
                        rngs={"random_features": jax.random.PRNGKey(seed)})

  y_a, y_b = train(5), train(6)
  assert not np.allclose(y_a, y_fixed) and not np.allclose(y_a, y_b)
  np.testing.assert_array_equal(y_a, train(5))
  # The fixed matrix depends on feature_seed only.
  other = _build("performer", feature_seed=1).apply(params, x, mask)
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
  np.testing.assert_allclose(np.linalg.norm(np.asarray(w), axis=1), norms, rtol=1e-5)
  for block in (w[0:4], w[4:8], w[8:10]):
    gram = np.asarray(block @ block.T)
    np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0.0, atol=1e-4)
  with pytest.raises(ValueError, match="num_features"):
    performer_lib.lra_orthogonal_random_matrix(key, 0, 4)


def test_performer_lra_bugs_draws_features_from_the_query_sum_every_call():
  x, mask = _inputs(), _mask()
  lra = _build("performer", num_features=2, lra_bugs=True)
  params = lra.init(jax.random.PRNGKey(1), x, mask)
  y, state = lra.apply(params, x, mask, mutable=["intermediates"])
  q = _proj(params["params"], "query", x)
  want = performer_lib.lra_orthogonal_random_matrix(performer_lib.lra_query_seed_key(q), 2, K)
  np.testing.assert_allclose(state["intermediates"]["projection_MxK"][0], want, rtol=1e-6)
  # The same in training mode, with or without an rng: no "redraw" rng is used.
  np.testing.assert_array_equal(
      lra.apply(params, x, mask, deterministic=False,
                rngs={"random_features": jax.random.PRNGKey(3)}), y)
  # Example 0's output depends on example 1 (the seed sums the whole batch) and on pads;
  # with the default fixed features it depends on neither.
  x_other = x.at[1].set(_inputs(seed=4)[1])
  fixed = _build("performer", num_features=2)
  np.testing.assert_allclose(fixed.apply(params, x_other, mask)[0],
                             fixed.apply(params, x, mask)[0], rtol=1e-6, atol=1e-6)
  assert not np.allclose(lra.apply(params, x_other, mask)[0], y[0], atol=1e-4)
  with pytest.raises(AssertionError):
    _check_padding_invariance(_build("performer", num_features=2, lra_bugs=True))


def test_performer_lra_bugs_leaves_the_relu_kernel_unchanged():
  x, mask = _inputs(), _mask()
  module = _build("performer", kernel="relu_deterministic")
  params = module.init(jax.random.PRNGKey(1), x, mask)
  np.testing.assert_array_equal(
      _build("performer", kernel="relu_deterministic", lra_bugs=True).apply(params, x, mask),
      module.apply(params, x, mask))


def test_feature_attention_small_denominator_guard():
  phi_q = jnp.full((1, 2, 1, 1), 1e-4)
  phi_k = jnp.full((1, 2, 1, 1), 1e-4)   # den = 2e-8 <= 1e-6: 2e-6 is added
  v = jnp.ones((1, 2, 1, 3))
  mask = jnp.ones((1, 2), bool)
  plain = performer_lib.normalized_feature_attention(phi_q, phi_k, v, mask, eps=0.0)
  guarded = performer_lib.normalized_feature_attention(phi_q, phi_k, v, mask, eps=0.0,
                                                       small_den=1e-6)
  np.testing.assert_allclose(plain, 1.0, rtol=1e-5)
  np.testing.assert_allclose(guarded, 2e-8 / (2e-8 + 2e-6), rtol=1e-4)


def test_performer_unknown_kernel_is_a_clear_error():
  with pytest.raises(ValueError, match=r"unknown performer kernel 'cos'.*attention_kwargs\.kernel"):
    _build("performer", kernel="cos").init(jax.random.PRNGKey(0), _inputs())


# --- AFT (Zhai et al., 2021) ---------------------------------------------------------------

def _aft_params(module, x, mask, name, scale=1.0, shift=0.0):
  params = module.init(jax.random.PRNGKey(1), x, mask)
  p = dict(params["params"])
  if name in ("aft_full", "aft_local"):
    field = "pos_bias" if name == "aft_full" else "pos_bias_band"
    p[field] = shift + scale * jax.random.normal(jax.random.PRNGKey(7), p[field].shape)
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
  y = module.apply(params, x, mask)
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
  x, mask = scale * _inputs(), _mask()
  params = _aft_params(module, x, mask, name, shift=200.0)
  y = module.apply(params, x, mask)
  chex.assert_tree_all_finite(y)
  p = params["params"]
  naive = _aft_naive(p, x, mask, _aft_dense_w(name, p, L, window), False, activation="relu")
  _assert_real_close(y, naive, mask, rtol=1e-4, atol=1e-3)


def test_aft_params_and_registry():
  x = _inputs()
  full = _build("aft_full", max_length=16).init(jax.random.PRNGKey(0), x)["params"]
  local = _build("aft_local", max_length=16, window=3).init(jax.random.PRNGKey(0), x)["params"]
  simple = _build("aft_simple").init(jax.random.PRNGKey(0), x)["params"]
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

@pytest.mark.parametrize("share_kv", [True, False])
@pytest.mark.parametrize("pad", [0, 7])
def test_linformer_equals_dense_form(pad, share_kv):
  module = _build("linformer", k=6, max_length=20, share_kv=share_kv)
  x, mask = _inputs(L + pad), _mask(L + pad, (L, L - 4))
  params = module.init(jax.random.PRNGKey(1), x, mask)
  y = module.apply(params, x, mask)
  p = params["params"]
  q, k, v = _qkv(p, x)
  m = mask[:, :, None, None]
  e_LxR = p["proj_E"][:L + pad]
  f_LxR = e_LxR if share_kv else p["proj_F"][:L + pad]
  k_proj = jnp.einsum("lr,blhd->brhd", e_LxR, k * m)   # E^T K, pads zeroed first
  v_proj = jnp.einsum("lr,blhd->brhd", f_LxR, v * m)   # E^T V (or F^T V)
  logits = jnp.einsum("bihd,brhd->bhir", q, k_proj) / np.sqrt(K)
  naive = _out(p, jnp.einsum("bhir,brhd->bihd", jax.nn.softmax(logits, -1), v_proj))
  _assert_real_close(y, naive, mask)
  assert ("proj_F" in p) == (not share_kv)


def test_linformer_projection_has_lras_xavier_uniform_init():
  p = _build("linformer", k=16, max_length=150).init(jax.random.PRNGKey(0), _inputs())["params"]
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
