"""Linformer attention (Wang et al., 2020): softmax over keys and values projected along L.

``y = softmax(Q (E^T K)^T / sqrt(d)) (E^T V)`` per head, ``E`` ``[max_length, k]`` sliced to L
and shared by heads and (by default) keys and values. K and V are zeroed at pads BEFORE the
projection, so pads change nothing (LRA's ``models/linformer/linformer_attention.py`` projects
them). Set ``model.attention_kwargs.max_length = model.max_length + 1``; LRA uses ``k = 16``.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from simpletron_jax.model.attention import base, registry


class LinformerAttention(base.Attention):
  """Multi-head non-causal Linformer attention (:class:`base.Attention`'s fields, then its own).

  Attributes:
    dropout_rate: dropout on the ``[B, H, L, k]`` weights.
    k: the projected length (paper 256, LRA 16).
    max_length: rows of ``E``, at least the input length.
    share_kv: False: a separate ``F`` projects the values.
    lra_masking: True: LRA's projection of the pads, so outputs depend on padding.

  Parameters ``proj_E`` (and ``proj_F``): float32 ``[max_length, k]``, Xavier-uniform as LRA's
  ``lr_kernel`` (``models/linformer/linformer.py``). Softmax in float32.
  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``.

  Raises:
    ValueError: input longer than ``max_length``, ``k < 1``, or bad ``qkv_dim``.
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
    init = nn.initializers.xavier_uniform()
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
