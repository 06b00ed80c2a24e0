"""Softmax dot-product attention: the LRA Transformer baseline.

``softmax(Q K^T / sqrt(d)) V`` per head (Vaswani et al., 2017), as used by LRA
``models/transformer/transformer.py``. Quadratic in time and memory.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from simpletron_jax.attention import base


class SoftmaxAttention(nn.Module):
  """Multi-head softmax self-attention.

  Attributes:
    num_heads: H.
    qkv_dim: D, total width of queries, keys and values over all heads.
    out_dim: O, width of the output projection.
    dropout_rate: dropout on the attention weights (LRA's
      ``attention_dropout_rate``); only in the ``einsum`` implementation.
    causal: if True, position i attends to positions j <= i only.
    implementation: ``"einsum"`` (explicit ``[B, H, L, L]`` weights) or
      ``"fused"`` (``jax.nn.dot_product_attention``: XLA on CPU, cuDNN flash
      attention on GPU where available). ``"fused"`` has no attention
      dropout.
    dtype: computation dtype.

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``.
  Keys at padded positions get zero weight, so outputs at real positions do
  not depend on padding.

  Raises:
    ValueError: for an unknown ``implementation``, or ``"fused"`` with a
      nonzero ``dropout_rate`` in training mode.
  """

  num_heads: int
  qkv_dim: int
  out_dim: int
  dropout_rate: float = 0.0
  causal: bool = False
  implementation: str = "einsum"
  dtype: base.Dtype = jnp.float32

  @nn.compact
  def __call__(self, x_BxLxE, mask_BxL=None, *, deterministic: bool = True):
    mask_BxL = base.default_mask(x_BxLxE, mask_BxL)
    q, k, v = base.project_qkv(x_BxLxE, self.num_heads, self.qkv_dim, self.dtype)
    length = x_BxLxE.shape[1]
    # [B, 1, L(query), L(key)] keep-mask: real keys, and j <= i when causal.
    keep_Bx1xLxL = mask_BxL[:, None, None, :]
    if self.causal:
      keep_Bx1xLxL = keep_Bx1xLxL & jnp.tril(jnp.ones((length, length), bool))[None, None]

    if self.implementation == "einsum":
      q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
      logits_BxHxLxL = jnp.einsum("bqhd,bkhd->bhqk", q, k)
      big_neg = jnp.finfo(logits_BxHxLxL.dtype).min
      logits_BxHxLxL = jnp.where(keep_Bx1xLxL, logits_BxHxLxL, big_neg)
      weights_BxHxLxL = jax.nn.softmax(logits_BxHxLxL.astype(jnp.float32), axis=-1)
      weights_BxHxLxL = weights_BxHxLxL.astype(self.dtype)
      weights_BxHxLxL = nn.Dropout(self.dropout_rate)(weights_BxHxLxL,
                                                      deterministic=deterministic)
      y_BxLxHxK = jnp.einsum("bhqk,bkhd->bqhd", weights_BxHxLxL, v)
    elif self.implementation == "fused":
      if self.dropout_rate > 0 and not deterministic:
        raise ValueError("softmax implementation 'fused' has no attention dropout; set "
                         "model.attention_dropout_rate=0 or use implementation 'einsum'")
      # A padded query row has no real key; keep its diagonal so the row is finite.
      eye = jnp.eye(length, dtype=bool)[None, None]
      keep_Bx1xLxL = keep_Bx1xLxL | (eye & ~mask_BxL[:, None, :, None])
      y_BxLxHxK = jax.nn.dot_product_attention(q, k, v, mask=keep_Bx1xLxL)
    else:
      raise ValueError(f"unknown softmax implementation {self.implementation!r}; "
                       "expected 'einsum' or 'fused'")
    return base.output_projection(y_BxLxHxK, self.out_dim, self.dtype)
