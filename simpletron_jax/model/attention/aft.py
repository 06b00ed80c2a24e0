"""Attention Free Transformer (Zhai et al., 2021): AFT-full, AFT-simple and AFT-local.

Per feature d of ``D = qkv_dim`` (one "head" per feature) and position t::

    Y_t = sigma_q(Q_t) * sum_t' exp(K_t' + w_{t,t'}) V_t' / sum_t' exp(K_t' + w_{t,t'})

``sigma_q`` sigmoid (or ``activation="relu"``). ``w``: ``aft_full`` a learned
``[max_length, max_length]`` matrix (O(T^2 d)); ``aft_simple`` 0 (O(T d)); ``aft_local`` a
learned band ``|t - t'| < window`` (O(T window d), no ``T x T`` array). ``exp(K)`` is 0 at
pads; ``K``'s real maximum and ``w``'s row maxima are subtracted (they cancel; in causal forms
too, so later tokens reach earlier outputs only through rounding). Set
``model.attention_kwargs.max_length = model.max_length + 1`` for ``full`` and ``local``.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from simpletron_jax.model.attention import base, registry

VARIANTS = ("full", "simple", "local")
ACTIVATIONS = ("sigmoid", "relu")


def _stable_exp_keys(k_BxTxD, v_BxTxD, mask_BxT):
  """float32 ``(exp(K - max_real K), same * V)``, zero at pads."""
  real_BxTx1 = mask_BxT[:, :, None]
  kmax_Bx1xD = jnp.max(jnp.where(real_BxTx1, k_BxTxD, -jnp.inf), axis=1, keepdims=True)
  kmax_Bx1xD = jax.lax.stop_gradient(jnp.where(jnp.isfinite(kmax_Bx1xD), kmax_Bx1xD, 0.0))
  ek_BxTxD = jnp.exp(jnp.where(real_BxTx1, k_BxTxD - kmax_Bx1xD, -jnp.inf))
  return ek_BxTxD, ek_BxTxD * jnp.where(real_BxTx1, v_BxTxD, 0.0)


def _ratio(num, den):
  """``num / den`` with 0 where ``den`` is 0 (no real key in reach)."""
  return num / jnp.where(den == 0, 1.0, den)


def aft_simple(k_BxTxD, v_BxTxD, mask_BxT, *, causal: bool):
  """AFT-simple context ``[B, T, D]``: ``sum_t' softmax_t'(K) V_t'`` (causal: ``t' <= t``)."""
  ek_BxTxD, ekv_BxTxD = _stable_exp_keys(k_BxTxD, v_BxTxD, mask_BxT)
  if causal:
    return _ratio(jnp.cumsum(ekv_BxTxD, axis=1), jnp.cumsum(ek_BxTxD, axis=1))
  y_Bx1xD = _ratio(ekv_BxTxD.sum(axis=1, keepdims=True), ek_BxTxD.sum(axis=1, keepdims=True))
  return jnp.broadcast_to(y_Bx1xD, k_BxTxD.shape)


def aft_full(k_BxTxD, v_BxTxD, mask_BxT, w_MxM, *, causal: bool):
  """AFT-full context ``[B, T, D]``: ``exp(w)[:T, :T] @ (exp(K) V)`` over ``exp(w) @ exp(K)``.

  ``w_MxM`` is the bias parameter, ``M >= T``; quadratic in T. float32 keys and values.
  """
  t = k_BxTxD.shape[1]
  ek_BxTxD, ekv_BxTxD = _stable_exp_keys(k_BxTxD, v_BxTxD, mask_BxT)
  w_MxM = w_MxM.astype(jnp.float32)
  wmax_Mx1 = jax.lax.stop_gradient(jnp.max(w_MxM, axis=1, keepdims=True))
  ew_TxT = jnp.exp(w_MxM[:t, :t] - wmax_Mx1[:t])
  if causal:
    ew_TxT = ew_TxT * jnp.tril(jnp.ones((t, t), ew_TxT.dtype))
  num_BxTxD = jnp.einsum("ts,bsd->btd", ew_TxT, ekv_BxTxD)
  den_BxTxD = jnp.einsum("ts,bsd->btd", ew_TxT, ek_BxTxD)
  return _ratio(num_BxTxD, den_BxTxD)


def aft_local(k_BxTxD, v_BxTxD, mask_BxT, band_MxR, window: int, *, causal: bool):
  """AFT-local context ``[B, T, D]``, exact, sub-quadratic; ``band_MxR`` ``[M >= T, 2 window - 1]``.

  ``w_{t,t'} = band[t, t' - t + window - 1]`` inside the window, else 0. Keys outside come from
  prefix (and suffix) cumulative sums, with no subtraction of large sums; inside, blocks of
  ``C = min(window, T)`` queries see the keys of blocks n-1..n+1 (``[B, T/C, 3C, D]``). Each
  query's band maximum (and 0) is subtracted.
  """
  b, t, d = k_BxTxD.shape
  s = window
  ek_BxTxD, ekv_BxTxD = _stable_exp_keys(k_BxTxD, v_BxTxD, mask_BxT)
  band_TxR = band_MxR[:t].astype(jnp.float32)
  # Per-query stabiliser: the largest weight in reach (0 is the weight outside).
  c_Tx1 = jax.lax.stop_gradient(jnp.maximum(jnp.max(band_TxR, axis=1, keepdims=True), 0.0))
  outside_scale_1xTx1 = jnp.exp(-c_Tx1)[None]

  def outside(x_BxTxD):
    before_BxTxD = jnp.pad(jnp.cumsum(x_BxTxD, axis=1), ((0, 0), (s, 0), (0, 0)))[:, :t]
    if causal:
      return before_BxTxD
    suffix_BxTxD = jnp.flip(jnp.cumsum(jnp.flip(x_BxTxD, axis=1), axis=1), axis=1)
    after_BxTxD = jnp.pad(suffix_BxTxD, ((0, 0), (0, s), (0, 0)))[:, s:s + t]
    return before_BxTxD + after_BxTxD

  c = min(s, t)
  n_blocks = -(-t // c)
  tail = n_blocks * c - t

  def key_windows(x_BxTxD):
    x = jnp.pad(x_BxTxD, ((0, 0), (c, c + tail), (0, 0))).reshape(b, n_blocks + 2, c, d)
    return jnp.concatenate([x[:, :-2], x[:, 1:-1], x[:, 2:]], axis=2)  # [B, N, 3C, D]

  i_Cx1 = jnp.arange(c)[:, None]
  j_1x3C = jnp.arange(3 * c)[None, :]
  offset_Cx3C = j_1x3C - c - i_Cx1                       # t' - t
  inside_Cx3C = jnp.abs(offset_Cx3C) < s
  if causal:
    inside_Cx3C = inside_Cx3C & (offset_Cx3C <= 0)
  r_Cx3C = jnp.clip(offset_Cx3C + s - 1, 0, 2 * s - 2)
  band_NxCxR = jnp.pad(band_TxR - c_Tx1, ((0, tail), (0, 0))).reshape(n_blocks, c, 2 * s - 1)
  w_NxCx3C = jnp.take_along_axis(band_NxCxR, jnp.broadcast_to(r_Cx3C, (n_blocks, c, 3 * c)),
                                 axis=2)
  ew_NxCx3C = jnp.where(inside_Cx3C[None], jnp.exp(w_NxCx3C), 0.0)

  def inside(x_BxTxD):
    y_BxNxCxD = jnp.einsum("nij,bnjd->bnid", ew_NxCx3C, key_windows(x_BxTxD))
    return y_BxNxCxD.reshape(b, n_blocks * c, d)[:, :t]

  num_BxTxD = outside_scale_1xTx1 * outside(ekv_BxTxD) + inside(ekv_BxTxD)
  den_BxTxD = outside_scale_1xTx1 * outside(ek_BxTxD) + inside(ek_BxTxD)
  return _ratio(num_BxTxD, den_BxTxD)


class AFTAttention(base.Attention):
  """An AFT layer (:class:`base.Attention`'s fields, then its own).

  ``num_heads`` only shapes the projections; ``qkv_dim`` is D, the AFT features.

  Attributes:
    dropout_rate: unused (no attention weights are formed).
    variant: ``"full"``, ``"simple"`` or ``"local"`` (set by the registry).
    causal: position t sees t' <= t only.
    activation: ``sigma_q``, ``"sigmoid"`` (paper) or ``"relu"``.
    max_length: rows of the position bias (``full``, ``local``), at least the input length.
    window: s, AFT-local's window.

  Parameters ``pos_bias`` ``[max_length, max_length]`` (full) or ``pos_bias_band``
  ``[max_length, 2 window - 1]`` (local), zero-initialised. Sums in float32.
  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``.

  Raises:
    ValueError: unknown ``variant`` or ``activation``, ``window < 1``, or an input longer
      than ``max_length``, naming the ``model.attention_kwargs`` field.
  """

  variant: str = "simple"
  causal: bool = False
  activation: str = "sigmoid"
  max_length: int = 2048
  window: int = 32

  @nn.compact
  def __call__(self, x_BxLxE, mask_BxL=None, *, deterministic: bool = True):
    del deterministic  # no dropout inside AFT
    if self.variant not in VARIANTS:
      raise ValueError(f"unknown AFT variant {self.variant!r}; expected one of {VARIANTS}")
    if self.activation not in ACTIVATIONS:
      raise ValueError(f"unknown AFT activation {self.activation!r} "
                       f"(model.attention_kwargs.activation); expected one of {ACTIVATIONS}")
    b, length = x_BxLxE.shape[:2]
    if self.variant != "simple":
      base.check_max_length(f"aft_{self.variant}", length, self.max_length)
    if self.variant == "local" and self.window < 1:
      raise ValueError(f"model.attention_kwargs.window={self.window} must be >= 1 for aft_local")
    mask_BxL = base.default_mask(x_BxLxE, mask_BxL)
    q, k, v = self.project_qkv(x_BxLxE)
    head_shape = q.shape[2:]
    q_BxLxD, k_BxLxD, v_BxLxD = (t.reshape(b, length, self.qkv_dim).astype(jnp.float32)
                                 for t in (q, k, v))
    if self.variant == "full":
      w_MxM = self.param("pos_bias", nn.initializers.zeros,
                         (self.max_length, self.max_length), jnp.float32)
      context_BxLxD = aft_full(k_BxLxD, v_BxLxD, mask_BxL, w_MxM, causal=self.causal)
    elif self.variant == "local":
      band_MxR = self.param("pos_bias_band", nn.initializers.zeros,
                            (self.max_length, 2 * self.window - 1), jnp.float32)
      context_BxLxD = aft_local(k_BxLxD, v_BxLxD, mask_BxL, band_MxR, self.window,
                                causal=self.causal)
    else:
      context_BxLxD = aft_simple(k_BxLxD, v_BxLxD, mask_BxL, causal=self.causal)
    gate_BxLxD = jax.nn.sigmoid(q_BxLxD) if self.activation == "sigmoid" else jax.nn.relu(q_BxLxD)
    y_BxLxD = (gate_BxLxD * context_BxLxD).astype(self.dtype)
    return self.project_out(y_BxLxD.reshape(b, length, *head_shape))


_AFT = "Zhai et al., An Attention Free Transformer (2021)"
registry.register(registry.AttentionSpec("aft_full", AFTAttention, {"variant": "full"},
                                         quadratic=True, paper=_AFT))
registry.register(registry.AttentionSpec("aft_simple", AFTAttention, {"variant": "simple"},
                                         paper=_AFT, length_padding_exact=True))
registry.register(registry.AttentionSpec("aft_local", AFTAttention, {"variant": "local"},
                                         paper=_AFT))
