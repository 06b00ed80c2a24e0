"""Longformer attention: a sliding window plus global attention on position 0.

Beltagy et al., "Longformer: The Long-Document Transformer" (2020), the
non-dilated sliding window with global attention, as in LRA
(``models/longformer/longformer_attention.py``, ``sliding_window_size=512``).

Window convention (LRA's ``_build_sliding_window_mask``): a window of w
tokens covers ``w - w // 2`` positions to the left INCLUDING the query itself
and ``w // 2`` to the right, i.e. query i sees key j iff
``-(w - w // 2 - 1) <= j - i <= w // 2`` (w keys in all; for odd w the two
sides are equal, for even w the right side gets one more).

Global attention on position 0 (the CLS token the encoder prepends; with
MEAN pooling it is the first token): token 0 attends to every real key and
every query attends to token 0. Only real keys get weight.

The window is computed blockwise, with no ``L x L`` array: the sequence is cut
into chunks of ``s = min(w // 2, L)`` tokens (at least 1); each chunk's
queries score the keys of the chunk and its two neighbours,
``[B, H, L/s, s, 3s]``, with an exact band mask, and one extra column for
key 0. Key 0 is removed from the band so that it is counted once. Memory and
time are ``O(L w)``.

Differences from LRA's code: LRA computes the global and the window outputs
with two separate sets of query/key/value projections (as the paper does)
and takes no global token by default; here one set of projections
(``query``/``key``/``value``, shared by every variant) serves both, and
position 0 is always global. Non-causal (LRA's encoders are bidirectional);
there is no causal form.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from simpletron_jax.attention import base
from simpletron_jax.attention.local import (check_int_field, masked_softmax, scale_queries,
                                            to_blocks, with_neighbours)


def window_offsets(window: int) -> tuple[int, int]:
  """The smallest and largest ``j - i`` a query sees in a window of ``window`` tokens.

  Returns:
    ``(-(window - window // 2 - 1), window // 2)``: LRA's convention.
  """
  return -(window - window // 2 - 1), window // 2


class LongformerAttention(nn.Module):
  """Multi-head sliding-window attention with a global first token (Beltagy et al., 2020).

  Attributes:
    num_heads: H.
    qkv_dim: D, total width of queries, keys and values over all heads.
    out_dim: O, width of the output projection.
    dropout_rate: dropout on the attention weights (window + global column,
      and the global row).
    window: w, the sliding window in tokens (LRA: 512); see the module
      docstring for the convention.
    dtype: computation dtype; the softmax is computed in float32.
    use_bias: biases on the query, key, value and output projections (config field
      ``model.attention_bias``; LRA's attentions have none, see :func:`base.head_projection`).

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``.
  Non-causal; outputs at real positions do not depend on padding.

  Raises:
    ValueError: if ``window < 1`` (naming ``model.attention_kwargs.window``),
      or ``qkv_dim`` is not a multiple of ``num_heads``.
  """

  num_heads: int
  qkv_dim: int
  out_dim: int
  dropout_rate: float = 0.0
  window: int = 512
  dtype: base.Dtype = jnp.float32
  use_bias: bool = True

  @nn.compact
  def __call__(self, x_BxLxE, mask_BxL=None, *, deterministic: bool = True):
    check_int_field(self.window, "window", "longformer")
    length = x_BxLxE.shape[1]
    mask_BxL = base.default_mask(x_BxLxE, mask_BxL)
    q, k, v = base.project_qkv(x_BxLxE, self.num_heads, self.qkv_dim, self.dtype,
                               use_bias=self.use_bias)
    q = scale_queries(q)
    lo, hi = window_offsets(self.window)
    s = max(1, min(self.window // 2, length))  # chunk size: covers lo..hi with neighbours

    q_BxNxsxHxK = to_blocks(q, s)
    k_BxNx3sxHxK = with_neighbours(to_blocks(k, s))
    v_BxNx3sxHxK = with_neighbours(to_blocks(v, s))
    real_BxNx3s = with_neighbours(to_blocks(mask_BxL, s, False))
    batch, num_chunks = q_BxNxsxHxK.shape[:2]

    # Static band mask [N, s, 3s]; key 0 is excluded here and added as the global column.
    q_pos = np.arange(num_chunks)[:, None] * s + np.arange(s)[None, :]
    k_pos = (np.arange(num_chunks)[:, None] - 1) * s + np.arange(3 * s)[None, :]
    offset = k_pos[:, None, :] - q_pos[:, :, None]
    band_Nxsx3s = (offset >= lo) & (offset <= hi) & (k_pos[:, None, :] > 0)

    window_BxHxNxsx3s = jnp.einsum("bnqhd,bnkhd->bhnqk", q_BxNxsxHxK, k_BxNx3sxHxK)
    keep_window = band_Nxsx3s[None, None] & real_BxNx3s[:, None, :, None, :]
    global_BxHxNxsx1 = jnp.einsum("bnqhd,bhd->bhnq", q_BxNxsxHxK, k[:, 0])[..., None]
    keep_global = jnp.broadcast_to(mask_BxL[:, 0, None, None, None, None],
                                   global_BxHxNxsx1.shape)
    weights = masked_softmax(
        jnp.concatenate([window_BxHxNxsx3s, global_BxHxNxsx1], -1),
        jnp.concatenate([jnp.broadcast_to(keep_window, window_BxHxNxsx3s.shape),
                         keep_global], -1), self.dtype)
    weights = nn.Dropout(self.dropout_rate)(weights, deterministic=deterministic)
    y_BxNxsxHxK = (jnp.einsum("bhnqk,bnkhd->bnqhd", weights[..., :-1], v_BxNx3sxHxK)
                   + jnp.einsum("bhnq,bhd->bnqhd", weights[..., -1], v[:, 0]))
    y_BxLxHxK = y_BxNxsxHxK.reshape((batch, num_chunks * s) + q.shape[2:])[:, :length]

    # Global row: position 0 attends to every real key.
    row_BxHxL = masked_softmax(jnp.einsum("bhd,blhd->bhl", q[:, 0], k),
                               mask_BxL[:, None, :], self.dtype)
    row_BxHxL = nn.Dropout(self.dropout_rate)(row_BxHxL, deterministic=deterministic)
    y0_BxHxK = jnp.einsum("bhl,blhd->bhd", row_BxHxL, v)
    y_BxLxHxK = y_BxLxHxK.at[:, 0].set(y0_BxHxK)
    return base.output_projection(y_BxLxHxK, self.out_dim, self.dtype, use_bias=self.use_bias)
