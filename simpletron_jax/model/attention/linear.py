"""Linear attention with the elu+1 feature map.

Katharopoulos et al., "Transformers are RNNs: Fast Autoregressive Transformers
with Linear Attention" (ICML 2020). Per head, with ``phi(x) = elu(x) + 1``::

    out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j))

The sums run over real tokens only. Because ``phi(0) = 1``, zeroing keys
before the feature map would not remove pads; the mask is applied AFTER the
feature map, so padded keys drop out of both sums (LRA's linear transformer
masks before it and so fails the padding-invariance test).

The two kernel functions here, :func:`normalized_feature_attention` and
:func:`causal_normalized_feature_attention`, work on any non-negative
feature maps; the Performer (``performer.py``) reuses them.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from simpletron_jax.model.attention import base, registry


def elu_feature_map(x: jnp.ndarray) -> jnp.ndarray:
  """``phi(x) = elu(x) + 1`` (Katharopoulos et al., 2020), elementwise.

  Args:
    x: any float array.

  Returns:
    An array of the same shape and dtype, strictly positive.
  """
  return jax.nn.elu(x) + 1.0


def _safe_divide(num, den, eps):
  """``num / (den + eps)``, with 0 where ``den + eps`` is 0 (a row with no key)."""
  den = den + eps
  return num / jnp.where(den == 0, 1.0, den)


def normalized_feature_attention(phi_q_BxLxHxM, phi_k_BxLxHxM, v_BxLxHxK, mask_BxL,
                                 eps: float = 1e-6, small_den: float = 0.0):
  """Non-causal normalised kernel attention from feature maps.

  ``y_i = phi_q_i^T (sum_j phi_k_j v_j^T) / (phi_q_i^T sum_j phi_k_j + eps)``
  with ``j`` over real tokens (Katharopoulos et al., 2020; also the renormalised
  FAVOR+ of Choromanski et al., 2021).

  Args:
    phi_q_BxLxHxM: query features, non-negative float.
    phi_k_BxLxHxM: key features, non-negative float; the values at padded
      positions are ignored (zeroed here, after the feature map).
    v_BxLxHxK: values; ignored at padded positions.
    mask_BxL: bool, True for real tokens.
    eps: added to the denominator (0 is allowed: a row whose denominator is 0
      then gives 0).
    small_den: the renormaliser of LRA's Performer (``models/performer/
      performer_attention.py``, its ``numerical_stabilizer``): where the denominator's
      absolute value is at most ``small_den``, ``2 * small_den`` is added to it. 0 (the
      default) changes nothing.

  Returns:
    ``[B, L, H, K]`` in the dtype of the inputs. No ``L x L`` array is built:
    the largest state is ``[B, H, M, K]``.
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
  """The exact token-to-token map of normalised kernel attention, formed explicitly.

  :func:`normalized_feature_attention` (and its causal form) compute ``A V`` without forming
  ``A``, where per head ``A_ij = phi_q_i . phi_k_j / (sum_j' phi_q_i . phi_k_j' + eps)``
  over real keys ``j`` (``j <= i`` when ``causal``; Katharopoulos et al., 2020; the
  Performer's FAVOR+ with ``small_den``). With the same arguments as those functions, their
  output is ``einsum("bhij,bjhk->bihk", A, v)`` (pads get zero weight). Quadratic in L: the
  modules compute it only when asked (:func:`base.sow_map`).

  Args:
    phi_q_BxLxHxM, phi_k_BxLxHxM: non-negative query and key features.
    mask_BxL: bool, True for real tokens (the keys kept).
    eps, small_den: as in :func:`normalized_feature_attention`.
    causal: the causal form's map.

  Returns:
    ``[B, H, L, L]`` float32, non-negative; each row sums to at most 1 (exactly
    ``den / (den + eps)``).
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
  """Causal normalised kernel attention: sums over real ``j <= i`` only.

  ``y_i = phi_q_i^T (sum_{j<=i} phi_k_j v_j^T) / (phi_q_i^T sum_{j<=i} phi_k_j + eps)``
  (Katharopoulos et al., 2020, the causal/RNN form). Chunked like
  :func:`simpletron_jax.model.attention.simple.causal_simple_attention`: a masked
  ``[C, C]`` product inside each chunk plus an exclusive prefix sum of the
  per-chunk states ``sum phi_k v^T`` (``[B, L/C, H, M, K]``) and
  ``sum phi_k`` (``[B, L/C, H, M]``), so no ``L x L`` array is built.

  Args:
    phi_q_BxLxHxM, phi_k_BxLxHxM: non-negative query and key features.
    v_BxLxHxK: values.
    mask_BxL: bool, True for real tokens; padded keys are left out.
    chunk_size: C in tokens (positive); L need not be a multiple of it.
    eps: added to the denominator.

  Returns:
    ``[B, L, H, K]``.
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
  """Multi-head linear attention, ``phi(x) = elu(x) + 1`` (Katharopoulos et al., 2020).

  Fields: :class:`base.Attention`'s ``num_heads`` (H), ``qkv_dim`` (D, over all heads),
  ``out_dim`` (O), ``use_bias`` and ``dense_init`` (of the ``query``, ``key``, ``value`` and
  ``out`` projections), then ``dropout_rate``, ``dtype`` and its own options:

  Attributes:
    dropout_rate: unused: linear attention forms no attention weights to drop out (it sums
      ``phi(K)^T V`` instead); kept so every variant takes the same arguments.
    causal: if True, position i sees real positions j <= i only (chunked
      form, never an ``L x L`` array).
    chunk_size: chunk length in tokens for the causal form.
    eps: added to the normaliser, as in the paper's code (1e-6).
    lra_masking: False (default): pads are left out of both sums. True: LRA's
      ``models/linear_transformer/linear_attention.py``, which never applies the padding
      mask, so pads enter both sums (outputs then depend on the padding).
    dtype: computation dtype of the projections; the feature maps and sums
      are computed in float32 and cast back.

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``.
  Outputs at real positions do not depend on padding. Applied with ``mutable=[base.MAPS]``,
  it sows the exact map :func:`feature_attention_map` ``[B, H, L, L]`` as ``"map"``
  (:func:`base.sow_map`).

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
