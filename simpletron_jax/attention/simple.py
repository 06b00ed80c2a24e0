"""SimpleAttention: softmax-free attention in linear time and memory.

Yorsh et al., "SimpleTRON: Simple Transformer with O(N) Complexity"
(2021/2022). Per head::

    SimpleAttention(Q, K, V) = Q (K^T V) / sqrt(L)

with ``Q = X W_q + b_q`` and likewise K, V. ``K^T V`` is formed first, so the
cost is O(L d^2) time and O(L d) memory; no softmax and no 1/sqrt(d) term.
``L`` is each example's number of real tokens (CLS included), not the padded
length: padded positions are zeroed in Q, K and V and so drop out of
``K^T V`` (the authors' later fixed code masks q, k and v).

Paper Table 1 variants are built from this one module by the registry
(``simpletron_jax.attention``): ``simple`` has no output projection and
needs ``qkv_dim == out_dim``; ``simple_res`` adds the encoder's double skip;
``simple_resl`` adds the output projection back.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from simpletron_jax.attention import base


def simple_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask_BxL):
  """Non-causal SimpleAttention on projected heads.

  Args:
    q_BxLxHxK, k_BxLxHxK, v_BxLxHxK: per-head queries, keys, values.
    mask_BxL: bool, True for real tokens.

  Returns:
    ``[B, L, H, K]``; rows at padded positions are 0. No ``L x L`` array is
    built: the largest intermediate is ``K^T V`` of shape ``[B, H, K, K]``.
  """
  m_BxLx1x1 = mask_BxL[:, :, None, None].astype(q_BxLxHxK.dtype)
  q, k, v = q_BxLxHxK * m_BxLx1x1, k_BxLxHxK * m_BxLx1x1, v_BxLxHxK * m_BxLx1x1
  kv_BxHxKxK = jnp.einsum("blhd,blhe->bhde", k, v)
  y_BxLxHxK = jnp.einsum("blhd,bhde->blhe", q, kv_BxHxKxK)
  n_B = jnp.maximum(mask_BxL.sum(axis=-1), 1).astype(y_BxLxHxK.dtype)
  return y_BxLxHxK / jnp.sqrt(n_B)[:, None, None, None]


def causal_simple_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask_BxL, chunk_size: int):
  """Causal SimpleAttention: ``y_i = q_i (sum_{j<=i} k_j^T v_j) / sqrt(n_i)``.

  ``n_i`` is the number of real tokens at positions ``<= i``. The sequence is
  split into chunks of ``chunk_size`` tokens: inside a chunk the masked
  ``[C, C]`` product is used, across chunks an exclusive prefix sum of
  per-chunk ``K^T V`` states (``[B, L/C, H, K, K]``), so memory stays linear
  in L for a fixed chunk size.

  Args:
    q_BxLxHxK, k_BxLxHxK, v_BxLxHxK: per-head queries, keys, values.
    mask_BxL: bool, True for real tokens.
    chunk_size: C in tokens.

  Returns:
    ``[B, L, H, K]``.
  """
  b, length, h, d = q_BxLxHxK.shape
  c = min(chunk_size, length)
  n_chunks = -(-length // c)
  pad = n_chunks * c - length
  m = mask_BxL.astype(q_BxLxHxK.dtype)
  count_BxL = jnp.maximum(jnp.cumsum(m, axis=1), 1.0)
  m_BxLx1x1 = m[:, :, None, None]

  def chunked(t):
    t = jnp.pad(t * m_BxLx1x1, ((0, 0), (0, pad), (0, 0), (0, 0)))
    return t.reshape(b, n_chunks, c, h, d)

  q, k, v = chunked(q_BxLxHxK), chunked(k_BxLxHxK), chunked(v_BxLxHxK)
  kv_BxNxHxKxK = jnp.einsum("bnchd,bnche->bnhde", k, v)
  prefix_BxNxHxKxK = jnp.cumsum(kv_BxNxHxKxK, axis=1) - kv_BxNxHxKxK
  inter = jnp.einsum("bnchd,bnhde->bnche", q, prefix_BxNxHxKxK)
  scores_BxNxHxCxC = jnp.einsum("bnqhd,bnkhd->bnhqk", q, k)
  scores_BxNxHxCxC = scores_BxNxHxCxC * jnp.tril(jnp.ones((c, c), q.dtype))
  intra = jnp.einsum("bnhqk,bnkhe->bnqhe", scores_BxNxHxCxC, v)
  y = (inter + intra).reshape(b, n_chunks * c, h, d)[:, :length]
  return y / jnp.sqrt(count_BxL)[:, :, None, None]


class SimpleAttention(nn.Module):
  """Multi-head SimpleAttention (SimpleTRON, Yorsh et al.).

  Attributes:
    num_heads: H.
    qkv_dim: D, total width of queries, keys and values over all heads.
    out_dim: O. Without the output projection the concatenated heads are the
      output, so ``qkv_dim`` must equal ``out_dim``.
    dropout_rate: unused; there is no attention-weight matrix to drop out.
      Kept so every variant takes the same arguments.
    use_output_proj: False for paper variants Simple and Simple-Res, True for
      Simple-ResL.
    causal: if True, position i sees positions j <= i only.
    chunk_size: chunk length in tokens for the causal form.
    dtype: computation dtype.

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``.

  Raises:
    ValueError: if ``use_output_proj`` is False and ``qkv_dim != out_dim``
      (config fields ``model.qkv_dim`` and ``model.emb_dim``).
  """

  num_heads: int
  qkv_dim: int
  out_dim: int
  dropout_rate: float = 0.0
  use_output_proj: bool = False
  causal: bool = False
  chunk_size: int = 128
  dtype: base.Dtype = jnp.float32

  @nn.compact
  def __call__(self, x_BxLxE, mask_BxL=None, *, deterministic: bool = True):
    del deterministic  # no dropout inside SimpleAttention
    if not self.use_output_proj and self.qkv_dim != self.out_dim:
      raise ValueError(
          f"attention 'simple' and 'simple_res' have no output projection, so "
          f"model.qkv_dim ({self.qkv_dim}) must equal model.emb_dim ({self.out_dim}); "
          "use attention 'simple_resl' for a different qkv_dim")
    mask_BxL = base.default_mask(x_BxLxE, mask_BxL)
    q, k, v = base.project_qkv(x_BxLxE, self.num_heads, self.qkv_dim, self.dtype)
    if self.causal:
      y_BxLxHxK = causal_simple_attention(q, k, v, mask_BxL, self.chunk_size)
    else:
      y_BxLxHxK = simple_attention(q, k, v, mask_BxL)
    if self.use_output_proj:
      return base.output_projection(y_BxLxHxK, self.out_dim, self.dtype)
    return y_BxLxHxK.reshape(*y_BxLxHxK.shape[:2], self.qkv_dim)
