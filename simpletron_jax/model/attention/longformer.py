"""Longformer attention (Beltagy et al., 2020): a sliding window, optionally position 0 global.

The non-dilated window of LRA's ``models/longformer/longformer_attention.py`` (window 512, no
global token: LRA never passes a ``global_mask``). A window of w tokens: query i sees key j
iff ``-(w - w // 2 - 1) <= j - i <= w // 2`` (LRA's ``_build_sliding_window_mask``). LRA's
parameters: ``query``/``key``/``value`` for the window, ``*_global`` (always made), ``out``.
``global_first``: every query also sees key 0, and position 0 sees every key through the
global projections. Blockwise, no ``L x L`` array: chunks of ``s = min(w // 2, L)`` score their
and their neighbours' keys, ``[B, H, L/s, s, 3s]``; O(L w). Non-causal.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from simpletron_jax.model.attention import base, registry
from simpletron_jax.model.attention.local import (check_int_field, masked_softmax, scale_queries,
                                                  to_blocks, with_neighbours)


def window_offsets(window: int) -> tuple[int, int]:
  """The smallest and largest ``j - i`` of a window of ``window`` tokens (LRA's convention)."""
  return -(window - window // 2 - 1), window // 2


class LongformerAttention(base.Attention):
  """Sliding-window attention as LRA's module (:class:`base.Attention`'s fields, then its own).

  Attributes:
    dropout_rate: dropout on the weights (window, key-0 column, global row).
    window: w in tokens (LRA: 512).
    global_first: position 0 global with the ``*_global`` projections (LRA's runs: False).
    lra_bugs: LRA's query-and-key mask: a pad query's row is uniform over all L keys, which
      shows only through LRA's MEAN over the pads.

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``; softmax in float32.

  Raises:
    ValueError: ``window < 1`` (``model.attention_kwargs.window``), or bad ``qkv_dim``.
  """

  window: int = 512
  global_first: bool = False
  lra_bugs: bool = False

  @nn.compact
  def __call__(self, x_BxLxE, mask_BxL=None, *, deterministic: bool = True):
    check_int_field(self.window, "window", "longformer")
    length = x_BxLxE.shape[1]
    mask_BxL = base.default_mask(x_BxLxE, mask_BxL)
    q, k, v = self.project_qkv(x_BxLxE)
    q_g, k_g, v_g = (self.project_heads(x_BxLxE, f"{name}_global")
                     for name in ("query", "key", "value"))
    q, q_g = scale_queries(q), scale_queries(q_g)
    lo, hi = window_offsets(self.window)
    s = max(1, min(self.window // 2, length))  # chunk size: covers lo..hi with neighbours

    q_BxNxsxHxK = to_blocks(q, s)
    k_BxNx3sxHxK = with_neighbours(to_blocks(k, s))
    v_BxNx3sxHxK = with_neighbours(to_blocks(v, s))
    real_BxNx3s = with_neighbours(to_blocks(mask_BxL, s, False))
    batch, num_chunks = q_BxNxsxHxK.shape[:2]

    # Static band mask [N, s, 3s]; with global_first, key 0 is the separate global column.
    q_pos = np.arange(num_chunks)[:, None] * s + np.arange(s)[None, :]
    k_pos = (np.arange(num_chunks)[:, None] - 1) * s + np.arange(3 * s)[None, :]
    offset = k_pos[:, None, :] - q_pos[:, :, None]
    band_Nxsx3s = (offset >= lo) & (offset <= hi) & (k_pos[:, None, :] > (
        0 if self.global_first else -1))
    window_BxHxNxsx3s = jnp.einsum("bnqhd,bnkhd->bhnqk", q_BxNxsxHxK, k_BxNx3sxHxK)
    keep_window = jnp.broadcast_to(band_Nxsx3s[None, None] & real_BxNx3s[:, None, :, None, :],
                                   window_BxHxNxsx3s.shape)
    dropout = nn.Dropout(self.dropout_rate)
    if self.global_first:
      global_BxHxNxsx1 = jnp.einsum("bnqhd,bhd->bhnq", q_BxNxsxHxK, k[:, 0])[..., None]
      keep_global = jnp.broadcast_to(mask_BxL[:, 0, None, None, None, None],
                                     global_BxHxNxsx1.shape)
      weights = masked_softmax(jnp.concatenate([window_BxHxNxsx3s, global_BxHxNxsx1], -1),
                               jnp.concatenate([keep_window, keep_global], -1), self.dtype)
      weights = dropout(weights, deterministic=deterministic)
      y_BxNxsxHxK = (jnp.einsum("bhnqk,bnkhd->bnqhd", weights[..., :-1], v_BxNx3sxHxK)
                     + jnp.einsum("bhnq,bhd->bnqhd", weights[..., -1], v[:, 0]))
    else:
      weights = masked_softmax(window_BxHxNxsx3s, keep_window, self.dtype)
      weights = dropout(weights, deterministic=deterministic)
      y_BxNxsxHxK = jnp.einsum("bhnqk,bnkhd->bnqhd", weights, v_BxNx3sxHxK)
    y_BxLxHxK = y_BxNxsxHxK.reshape((batch, num_chunks * s) + q.shape[2:])[:, :length]

    if self.lra_bugs:   # LRA: a padding query's row is uniform over all L positions
      y_BxLxHxK = jnp.where(mask_BxL[:, :, None, None], y_BxLxHxK,
                            jnp.mean(v, axis=1, keepdims=True))
    if self.global_first:
      row_BxHxL = masked_softmax(jnp.einsum("bhd,blhd->bhl", q_g[:, 0], k_g),
                                 mask_BxL[:, None, :], self.dtype)
      row_BxHxL = dropout(row_BxHxL, deterministic=deterministic)
      y0_BxHxK = jnp.einsum("bhl,blhd->bhd", row_BxHxL, v_g)
      if self.lra_bugs:
        y0_BxHxK = jnp.where(mask_BxL[:, 0, None, None], y0_BxHxK, jnp.mean(v_g, axis=1))
      y_BxLxHxK = y_BxLxHxK.at[:, 0].set(y0_BxHxK)
    return self.project_out(y_BxLxHxK)


registry.register(registry.AttentionSpec(
    "longformer", LongformerAttention, paper="Beltagy et al., Longformer (2020)"))
