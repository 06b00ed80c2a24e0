"""Longformer attention: a sliding window, optionally with global attention on position 0.

Beltagy et al., "Longformer: The Long-Document Transformer" (2020), the non-dilated sliding
window, as LRA's own module computes it (``models/longformer/longformer_attention.py``;
``sliding_window_size=512``, and no global token: LRA's encoders never pass a
``global_mask``).

Window convention (LRA's ``_build_sliding_window_mask``): a window of w tokens covers
``w - w // 2`` positions to the left INCLUDING the query itself and ``w // 2`` to the right,
i.e. query i sees key j iff ``-(w - w // 2 - 1) <= j - i <= w // 2`` (w keys in all; for
odd w the two sides are equal, for even w the right side gets one more).

Parameters (LRA's): the window uses ``query``/``key``/``value`` (LRA's
``*_sliding_window``), global attention ``query_global``/``key_global``/``value_global``;
both sets always exist, as in LRA, whether or not a global token is used; ``out`` merges
the heads.

``global_first=True`` (off by default, as in LRA's runs) makes position 0 global, as LRA's
module does for a ``global_mask`` that is True at position 0: every query also attends to key
0 through the window projections, and position 0 attends to every key through the global
projections. Only real keys get weight.

The window is computed blockwise, with no ``L x L`` array: the sequence is cut into chunks
of ``s = min(w // 2, L)`` tokens (at least 1); each chunk's queries score the keys of the
chunk and its two neighbours, ``[B, H, L/s, s, 3s]``, with an exact band mask (and, with
``global_first``, one extra column for key 0, removed from the band so that it counts
once). Memory and time are ``O(L w)``.

``lra_bugs=True`` reproduces LRA's treatment of padding queries: LRA masks queries and keys,
so a padding query's row is all masked and, at ``-1e10`` everywhere, comes out uniform over
ALL L keys (pads and positions outside the window included). This only shows through LRA's
MEAN over the pads. Non-causal (LRA's encoders are bidirectional); there is no causal form.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from simpletron_jax.model.attention import base, registry
from simpletron_jax.model.attention.local import (check_int_field, masked_softmax, scale_queries,
                                                  to_blocks, with_neighbours)


def window_offsets(window: int) -> tuple[int, int]:
  """The smallest and largest ``j - i`` a query sees in a window of ``window`` tokens.

  Returns:
    ``(-(window - window // 2 - 1), window // 2)``: LRA's convention.
  """
  return -(window - window // 2 - 1), window // 2


class LongformerAttention(base.Attention):
  """Multi-head sliding-window attention (Beltagy et al., 2020), as LRA's module.

  Fields: :class:`base.Attention`'s ``num_heads`` (H), ``qkv_dim`` (D, over all heads),
  ``out_dim`` (O), ``use_bias`` and ``dense_init`` (of the ``query``, ``key``, ``value``,
  ``*_global`` and ``out`` projections), then ``dropout_rate``, ``dtype`` and its own
  options:

  Attributes:
    dropout_rate: dropout on the attention weights (window, and with ``global_first`` the
      key-0 column and the global row).
    window: w, the sliding window in tokens (LRA: 512); see the module docstring for the
      convention.
    global_first: position 0 (CLS, or the first token with MEAN pooling) is global, with
      the ``*_global`` projections; LRA's runs: False (no global token).
    lra_bugs: padding queries attend uniformly to every position, as in LRA's
      ``models/longformer/longformer_attention.py`` (see the module docstring). Config
      field ``model.attention_kwargs.lra_bugs``; default False.
    dtype: computation dtype; the softmax is computed in float32.

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``.
  Non-causal; outputs at real positions do not depend on padding.

  Raises:
    ValueError: if ``window < 1`` (naming ``model.attention_kwargs.window``), or
      ``qkv_dim`` is not a multiple of ``num_heads``.
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
    # LRA creates the global projections whether or not a global token is used.
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
      # Global row: position 0 attends to every real key, with the global projections.
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
