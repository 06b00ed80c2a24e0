"""Linformer: softmax attention over keys and values projected along the length.

Wang et al., "Linformer: Self-Attention with Linear Complexity" (2020). Per
head, with a learned projection ``E`` of shape ``[max_length, k]`` sliced to
the input length L::

    y = softmax(Q (E^T K)^T / sqrt(d)) (E^T V)

One ``E`` is shared by the heads and (by default) by keys and values, the
paper's headwise and key-value sharing; ``share_kv=False`` learns a second
projection ``F`` for the values. The attention weights are ``[B, H, L, k]``,
linear in L.

Padding: K and V are zeroed at padded positions BEFORE the projection, so
pads add nothing to ``E^T K`` and ``E^T V``; with ``E`` sliced to ``[:L]``,
appending pads does not change what the real positions see. (LRA's Linformer
projects the pads too and so fails the padding-invariance test.)

Config note: the encoder does not pass the maximum length. Set
``model.attention_kwargs.max_length = model.max_length + 1`` (the CLS
token); the default is 2048. The LRA code uses ``k = 16``, the papers 256.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from simpletron_jax.model.attention import base, registry


class LinformerAttention(base.Attention):
  """Multi-head Linformer self-attention (Wang et al., 2020); non-causal.

  Fields: :class:`base.Attention`'s ``num_heads`` (H), ``qkv_dim`` (D, over all heads),
  ``out_dim`` (O), ``use_bias`` and ``dense_init`` (of the ``query``, ``key``, ``value`` and
  ``out`` projections), then ``dropout_rate``, ``dtype`` and its own options:

  Attributes:
    dropout_rate: dropout on the ``[B, H, L, k]`` attention weights.
    k: the projected length (``k = 256`` in the paper, 16 in LRA's code).
    max_length: rows of ``E``; must be at least the input length. Configs
      must set ``model.attention_kwargs.max_length = model.max_length + 1``.
    share_kv: if True (default) ``E`` projects both keys and values; if
      False a separate ``F`` projects the values.
    lra_masking: False (default): K and V are zeroed at pads before the projection.
      True: LRA's ``models/linformer/linformer_attention.py``, which projects the pads
      too (its dot product gets ``bias=None``), so outputs depend on the padding.
    dtype: computation dtype; the softmax is computed in float32.

  Parameters besides ``query``/``key``/``value``/``out``: ``proj_E``
  (and ``proj_F``) of shape ``[max_length, k]``, float32, initialised Xavier-uniform
  (``U(+-sqrt(6 / (max_length + k)))``) as LRA's ``lr_kernel``
  (``models/linformer/linformer.py`` passes ``xavier_uniform`` to
  ``linformer_attention.py``; LRA's ``max_len`` is ``max_length``, plus 1 with CLS).

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``.

  Raises:
    ValueError: if the input is longer than ``max_length`` (naming
      ``model.attention_kwargs.max_length``), ``k < 1``, or ``qkv_dim`` is
      not a multiple of ``num_heads``.
  """

  k: int = 256
  max_length: int = 2048
  share_kv: bool = True
  lra_masking: bool = False

  @nn.compact
  def __call__(self, x_BxLxE, mask_BxL=None, *, deterministic: bool = True):
    length = x_BxLxE.shape[1]
    base.check_max_length("linformer", length, self.max_length)
    if self.k < 1:
      raise ValueError(f"model.attention_kwargs.k={self.k} must be >= 1 for linformer")
    mask_BxL = base.lra_mask(base.default_mask(x_BxLxE, mask_BxL), self.lra_masking)
    q, k, v = self.project_qkv(x_BxLxE)
    init = nn.initializers.xavier_uniform()   # LRA's lr_kernel init
    e_MxR = self.param("proj_E", init, (self.max_length, self.k), jnp.float32)
    f_MxR = e_MxR if self.share_kv else self.param("proj_F", init, (self.max_length, self.k),
                                                   jnp.float32)
    e_LxR = e_MxR[:length].astype(self.dtype)
    f_LxR = f_MxR[:length].astype(self.dtype)

    real_BxLx1x1 = mask_BxL[:, :, None, None]
    k = jnp.where(real_BxLx1x1, k, 0.0)  # zero pads BEFORE the length projection
    v = jnp.where(real_BxLx1x1, v, 0.0)
    k_BxRxHxK = jnp.einsum("blhd,lr->brhd", k, e_LxR)
    v_BxRxHxK = jnp.einsum("blhd,lr->brhd", v, f_LxR)

    q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    logits_BxHxLxR = jnp.einsum("blhd,brhd->bhlr", q, k_BxRxHxK)
    weights_BxHxLxR = jax.nn.softmax(logits_BxHxLxR.astype(jnp.float32), axis=-1)
    weights_BxHxLxR = nn.Dropout(self.dropout_rate)(weights_BxHxLxR.astype(self.dtype),
                                                    deterministic=deterministic)
    y_BxLxHxK = jnp.einsum("bhlr,brhd->blhd", weights_BxHxLxR, v_BxRxHxK)
    return self.project_out(y_BxLxHxK)


registry.register(registry.AttentionSpec(
    "linformer", LinformerAttention, paper="Wang et al., Linformer (2020)"))
