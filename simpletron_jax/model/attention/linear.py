"""Linear attention with ``phi(x) = elu(x) + 1`` (Katharopoulos et al., ICML 2020).

``y_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j))`` per head, over real
keys. As ``phi(0) = 1``, pads are masked AFTER the feature map (LRA's
``models/linear_transformer/linear_attention.py`` does not mask). The kernel functions take
any non-negative features; the Performer reuses them.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from simpletron_jax.model.attention import base, registry


def elu_feature_map(x: jnp.ndarray) -> jnp.ndarray:
  """``phi(x) = elu(x) + 1``, elementwise: same shape and dtype, strictly positive."""
  return jax.nn.elu(x) + 1.0


def _safe_divide(num, den, eps):
  """``num / (den + eps)``, with 0 where ``den + eps`` is 0 (a row with no key)."""
  den = den + eps
  return num / jnp.where(den == 0, 1.0, den)


def normalized_feature_attention(phi_q_BxLxHxM, phi_k_BxLxHxM, v_BxLxHxK, mask_BxL,
                                 eps: float = 1e-6, small_den: float = 0.0):
  """Non-causal normalised kernel attention ``[B, L, H, K]``, with no ``L x L`` array.

  ``y_i = phi_q_i^T (sum_j phi_k_j v_j^T) / (phi_q_i^T sum_j phi_k_j + eps)``, ``j`` over real
  tokens (pad keys and values are zeroed here); also the Performer's renormalised FAVOR+.

  Args:
    phi_q_BxLxHxM, phi_k_BxLxHxM: non-negative features.
    v_BxLxHxK: values.
    mask_BxL: bool, True for real tokens.
    eps: added to the denominator; with 0 a zero denominator gives 0.
    small_den: LRA's Performer renormaliser (``models/performer/performer_attention.py``):
      ``2 * small_den`` is added to a denominator of absolute value at most ``small_den``.
  """
  m_BxLx1x1 = mask_BxL[:, :, None, None]
  phi_k_BxLxHxM = jnp.where(m_BxLx1x1, phi_k_BxLxHxM, 0.0)
  v_BxLxHxK = jnp.where(m_BxLx1x1, v_BxLxHxK, 0.0)
  kv_BxHxMxK = jnp.einsum("blhm,blhk->bhmk", phi_k_BxLxHxM, v_BxLxHxK)
  z_BxHxM = phi_k_BxLxHxM.sum(axis=1)
  num_BxLxHxK = jnp.einsum("blhm,bhmk->blhk", phi_q_BxLxHxM, kv_BxHxMxK)
  den_BxLxH = jnp.einsum("blhm,bhm->blh", phi_q_BxLxHxM, z_BxHxM)
  if small_den:
    den_BxLxH = den_BxLxH + 2.0 * small_den * (jnp.abs(den_BxLxH) <= small_den)
  return _safe_divide(num_BxLxHxK, den_BxLxH[..., None], eps)


def feature_attention_map(phi_q_BxLxHxM, phi_k_BxLxHxM, mask_BxL, eps: float = 1e-6,
                          small_den: float = 0.0, causal: bool = False):
  """The explicit ``[B, H, L, L]`` float32 map ``A`` of normalised kernel attention.

  ``A_ij = phi_q_i . phi_k_j / (sum_j' phi_q_i . phi_k_j' + eps)`` over real keys (``j <= i``
  when ``causal``), so that the same arguments to :func:`normalized_feature_attention` give
  ``einsum("bhij,bjhk->bihk", A, v)``. Rows sum to ``den / (den + eps)``. Quadratic: built only
  on request (:func:`base.sow_map`).
  """
  phi_k_BxLxHxM = jnp.where(mask_BxL[:, :, None, None], phi_k_BxLxHxM, 0.0)
  s_BxHxLxL = jnp.einsum("bihm,bjhm->bhij", phi_q_BxLxHxM, phi_k_BxLxHxM)
  if causal:
    length = s_BxHxLxL.shape[-1]
    s_BxHxLxL = s_BxHxLxL * jnp.tril(jnp.ones((length, length), s_BxHxLxL.dtype))
  den_BxHxL = s_BxHxLxL.sum(axis=-1)
  if small_den:
    den_BxHxL = den_BxHxL + 2.0 * small_den * (jnp.abs(den_BxHxL) <= small_den)
  return _safe_divide(s_BxHxLxL, den_BxHxL[..., None], eps)


def causal_normalized_feature_attention(phi_q_BxLxHxM, phi_k_BxLxHxM, v_BxLxHxK, mask_BxL,
                                        chunk_size: int, eps: float = 1e-6):
  """Causal normalised kernel attention ``[B, L, H, K]``: sums over real ``j <= i`` only.

  Chunked like :func:`simple.causal_simple_attention`: a masked ``[C, C]`` product within each
  chunk of ``chunk_size`` tokens (L need not divide) plus an exclusive prefix sum of the
  per-chunk states, so no ``L x L`` array is built.
  """
  b, length, h, m = phi_q_BxLxHxM.shape
  k = v_BxLxHxK.shape[-1]
  c = max(1, min(chunk_size, length))
  n_chunks = -(-length // c)
  pad = n_chunks * c - length
  m_BxLx1x1 = mask_BxL[:, :, None, None]

  def chunked(t_BxLxHxX):
    t_BxLxHxX = jnp.pad(t_BxLxHxX, ((0, 0), (0, pad), (0, 0), (0, 0)))
    return t_BxLxHxX.reshape(b, n_chunks, c, h, t_BxLxHxX.shape[-1])

  q_BxNxCxHxM = chunked(phi_q_BxLxHxM)
  k_BxNxCxHxM = chunked(jnp.where(m_BxLx1x1, phi_k_BxLxHxM, 0.0))
  v_BxNxCxHxK = chunked(jnp.where(m_BxLx1x1, v_BxLxHxK, 0.0))

  kv_BxNxHxMxK = jnp.einsum("bnchm,bnchk->bnhmk", k_BxNxCxHxM, v_BxNxCxHxK)
  z_BxNxHxM = k_BxNxCxHxM.sum(axis=2)
  kv_prefix = jnp.cumsum(kv_BxNxHxMxK, axis=1) - kv_BxNxHxMxK   # chunks before n
  z_prefix = jnp.cumsum(z_BxNxHxM, axis=1) - z_BxNxHxM
  num_inter = jnp.einsum("bnchm,bnhmk->bnchk", q_BxNxCxHxM, kv_prefix)
  den_inter = jnp.einsum("bnchm,bnhm->bnch", q_BxNxCxHxM, z_prefix)

  scores_BxNxHxCxC = jnp.einsum("bnqhm,bnphm->bnhqp", q_BxNxCxHxM, k_BxNxCxHxM)
  scores_BxNxHxCxC = scores_BxNxHxCxC * jnp.tril(jnp.ones((c, c), scores_BxNxHxCxC.dtype))
  num_intra = jnp.einsum("bnhqp,bnphk->bnqhk", scores_BxNxHxCxC, v_BxNxCxHxK)
  den_intra = jnp.einsum("bnhqp->bnqh", scores_BxNxHxCxC)

  num_BxLxHxK = (num_inter + num_intra).reshape(b, n_chunks * c, h, k)[:, :length]
  den_BxLxH = (den_inter + den_intra).reshape(b, n_chunks * c, h)[:, :length]
  return _safe_divide(num_BxLxHxK, den_BxLxH[..., None], eps)


class LinearAttention(base.Attention):
  """Multi-head linear attention (fields of :class:`base.Attention`, then its own).

  Attributes:
    dropout_rate: unused (no attention weights are formed).
    causal: position i sees real positions j <= i only (chunked).
    chunk_size: chunk length in tokens for the causal form.
    eps: added to the normaliser (1e-6, the paper's code).
    lra_masking: True: LRA's unmasked sums, so outputs depend on padding.

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``; features and sums
  in float32. Sows :func:`feature_attention_map` as the map.

  Raises:
    ValueError: if ``qkv_dim`` is not a multiple of ``num_heads``.
  """

  causal: bool = False
  chunk_size: int = 128
  eps: float = 1e-6
  lra_masking: bool = False

  @nn.compact
  def __call__(self, x_BxLxE, mask_BxL=None, *, deterministic: bool = True):
    del deterministic  # no dropout inside linear attention
    mask_BxL = base.lra_mask(base.default_mask(x_BxLxE, mask_BxL), self.lra_masking)
    q, k, v = self.project_qkv(x_BxLxE)
    phi_q_BxLxHxK = elu_feature_map(q.astype(jnp.float32))
    phi_k_BxLxHxK = elu_feature_map(k.astype(jnp.float32))
    v = v.astype(jnp.float32)
    base.sow_map(self, lambda: feature_attention_map(phi_q_BxLxHxK, phi_k_BxLxHxK, mask_BxL,
                                                     self.eps, causal=self.causal))
    if self.causal:
      y_BxLxHxK = causal_normalized_feature_attention(phi_q_BxLxHxK, phi_k_BxLxHxK, v,
                                                      mask_BxL, self.chunk_size, self.eps)
    else:
      y_BxLxHxK = normalized_feature_attention(phi_q_BxLxHxK, phi_k_BxLxHxK, v, mask_BxL,
                                               self.eps)
    return self.project_out(y_BxLxHxK.astype(self.dtype))


registry.register(registry.AttentionSpec(
    "linear", LinearAttention, paper="Katharopoulos et al., Transformers are RNNs (2020)",
    length_padding_exact=True))
