"""Attention Free Transformer: AFT-full, AFT-simple and AFT-local.

Zhai et al., "An Attention Free Transformer" (2021). With ``Q = X W_q``,
``K = X W_k``, ``V = X W_v`` of ``D = qkv_dim`` features (one "head" per
feature), every feature ``d`` and position ``t``::

    Y_t = sigma_q(Q_t) * sum_t' exp(K_t' + w_{t,t'}) * V_t' / sum_t' exp(K_t' + w_{t,t'})

``sigma_q`` is the sigmoid (paper default; ``activation="relu"`` is the
option) and the key nonlinearity is the paper's softmax over the context,
which is the ``exp(K) / sum exp(K)`` above. The variants differ in the
learned pairwise position bias ``w``:

* ``aft_full``: ``w`` is a learned ``[max_length, max_length]`` matrix
  (sliced to ``[:T, :T]``); O(T^2 d) time, O(T^2) memory for ``w``.
* ``aft_simple``: ``w = 0``; O(T d).
* ``aft_local``: ``w_{t,t'}`` is learned where ``|t - t'| < window`` and 0
  outside (the paper's ``w'``), stored as a band ``[max_length, 2 window - 1]``.
  Computed exactly without a ``T x T`` array: the sums over the keys outside
  the window come from prefix/suffix cumulative sums, the window from blocks
  of ``window`` tokens that see their neighbour blocks; O(T window d).

Masking: ``exp(K)`` is 0 at padded positions, in the numerator and the
denominator. For numerical stability ``K`` has its per-feature maximum over the
real positions subtracted and ``w`` the maximum of each row of its full
parameter (both cancel in the ratio, and neither depends on padding). Causal
forms (``causal=True``) keep ``t' <= t`` with cumulative sums (a masked ``w``
for ``aft_full``). Note that in the causal forms the key stabiliser is still
the maximum over all real positions: it cancels exactly, so later tokens only
touch earlier outputs through floating-point rounding.

The output is projected from ``D`` features to ``out_dim`` with
``base.output_projection``.

Config note: ``aft_full`` and ``aft_local`` need the maximum sequence length
for their position biases, which the encoder does not pass. Set
``model.attention_kwargs.max_length = model.max_length + 1`` (the CLS token);
the default is 2048.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from simpletron_jax.model.attention import base, registry

VARIANTS = ("full", "simple", "local")
ACTIVATIONS = ("sigmoid", "relu")


def _stable_exp_keys(k_BxTxD, v_BxTxD, mask_BxT):
  """``exp(K - max_real K)`` zeroed at pads, and the same times V.

  Returns:
    ``(ek_BxTxD, ekv_BxTxD)``, float32.
  """
  real_BxTx1 = mask_BxT[:, :, None]
  kmax_Bx1xD = jnp.max(jnp.where(real_BxTx1, k_BxTxD, -jnp.inf), axis=1, keepdims=True)
  kmax_Bx1xD = jax.lax.stop_gradient(jnp.where(jnp.isfinite(kmax_Bx1xD), kmax_Bx1xD, 0.0))
  ek_BxTxD = jnp.exp(jnp.where(real_BxTx1, k_BxTxD - kmax_Bx1xD, -jnp.inf))
  return ek_BxTxD, ek_BxTxD * jnp.where(real_BxTx1, v_BxTxD, 0.0)


def _ratio(num, den):
  """``num / den`` with 0 where ``den`` is 0 (no real key in reach)."""
  return num / jnp.where(den == 0, 1.0, den)


def aft_simple(k_BxTxD, v_BxTxD, mask_BxT, *, causal: bool):
  """AFT-simple context: ``sum_t' softmax_t'(K)_t' * V_t'`` (Zhai et al., 2021).

  Args:
    k_BxTxD, v_BxTxD: float32 keys and values.
    mask_BxT: bool, True for real tokens.
    causal: if True the sums run over ``t' <= t`` (cumulative sums).

  Returns:
    ``[B, T, D]``, the weighted average of values (before ``sigma_q(Q)``).
  """
  ek_BxTxD, ekv_BxTxD = _stable_exp_keys(k_BxTxD, v_BxTxD, mask_BxT)
  if causal:
    return _ratio(jnp.cumsum(ekv_BxTxD, axis=1), jnp.cumsum(ek_BxTxD, axis=1))
  y_Bx1xD = _ratio(ekv_BxTxD.sum(axis=1, keepdims=True), ek_BxTxD.sum(axis=1, keepdims=True))
  return jnp.broadcast_to(y_Bx1xD, k_BxTxD.shape)


def aft_full(k_BxTxD, v_BxTxD, mask_BxT, w_MxM, *, causal: bool):
  """AFT-full context with a learned pairwise bias (Zhai et al., 2021).

  ``sum_t' exp(K_t' + w_{t,t'}) V_t' / sum_t' exp(K_t' + w_{t,t'})``, as the
  product ``exp(w)[T, T] @ (exp(K) * V)[T, D]``. Quadratic in T.

  Args:
    k_BxTxD, v_BxTxD: float32 keys and values.
    mask_BxT: bool, True for real tokens.
    w_MxM: the position-bias parameter, ``M >= T``; ``[:T, :T]`` is used.
    causal: if True only ``t' <= t`` enter.

  Returns:
    ``[B, T, D]``.
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
  """AFT-local context, exact and sub-quadratic (Zhai et al., 2021).

  ``w_{t,t'} = band[t, t' - t + window - 1]`` for ``|t - t'| < window``, else 0.
  Split as ``sum_t' = sum_{outside window} exp(K) (.) + sum_{inside} exp(K + w) (.)``:

  * outside: ``sum_{t' <= t - s}`` from an inclusive prefix cumulative sum and
    (non-causal) ``sum_{t' >= t + s}`` from a suffix cumulative sum; no
    subtraction of large sums, so no cancellation;
  * inside: the sequence is cut into blocks of ``C = min(s, T)`` tokens; the
    queries of block n see the keys of blocks ``n - 1, n, n + 1``, which hold
    every key with ``|t - t'| < C``; the gathered band weights are
    ``[T/C, C, 3C]``.

  The band row maximum (and 0, the weight outside) is subtracted per query.

  Args:
    k_BxTxD, v_BxTxD: float32 keys and values.
    mask_BxT: bool, True for real tokens.
    band_MxR: band parameter, ``M >= T`` rows, ``R = 2 window - 1``.
    window: s >= 1.
    causal: if True only ``t' <= t`` enter.

  Returns:
    ``[B, T, D]``. Largest intermediates: ``[B, T, D]`` sums and
    ``[B, T/C, 3C, D]`` key windows.
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
  """Attention Free Transformer layer (Zhai et al., 2021): full, simple or local.

  Fields: :class:`base.Attention`'s ``num_heads`` (H; it only shares the projections, AFT
  itself has one "head" per feature), ``qkv_dim`` (D, the number of AFT features),
  ``out_dim`` (O), ``use_bias`` and ``dense_init`` (of the ``query``, ``key``, ``value`` and
  ``out`` projections), then ``dropout_rate``, ``dtype`` and its own options:

  Attributes:
    dropout_rate: unused; there is no attention-weight matrix to drop out.
      Kept so every variant takes the same arguments.
    variant: ``"full"``, ``"simple"`` or ``"local"`` (set by the registry).
    causal: if True, position t sees positions t' <= t only.
    activation: ``sigma_q``: ``"sigmoid"`` (paper) or ``"relu"``.
    max_length: rows (and columns) of the position bias of ``full`` and
      ``local``; must be at least the input length. Configs must set
      ``model.attention_kwargs.max_length = model.max_length + 1`` (CLS).
      Unused by ``simple``.
    window: s, the AFT-local window (``|t - t'| < s`` gets a learned bias).
      Unused by the other variants.
    dtype: computation dtype of the projections; the AFT sums are float32
      and cast back.

  Parameters besides ``query``/``key``/``value``/``out``: ``pos_bias``
  ``[max_length, max_length]`` (full) or ``pos_bias_band``
  ``[max_length, 2 window - 1]`` (local), initialised to zero.

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``.

  Raises:
    ValueError: for an unknown ``variant`` or ``activation``
      (``model.attention_kwargs.activation``), a ``window < 1``
      (``model.attention_kwargs.window``), or, for ``full``/``local``, an
      input longer than ``max_length`` (``model.attention_kwargs.max_length``).
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
