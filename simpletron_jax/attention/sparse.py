"""Sparse Transformer attention with the "fixed" pattern, bidirectional.

Child et al., "Generating Long Sequences with Sparse Transformers" (2019),
sec. 4.3, the fixed pattern with both of its parts merged into every head,
as in LRA (``models/sparse_transformer/sparse_attention.py``, patterns
``Fixed1Pattern`` + ``Fixed2Pattern`` with ``block_size=50, c=10`` set in
``utils/train_utils.py``). With block length ``l = block_size`` and
``c = num_summary``, query i attends to key j iff

* j is in i's block: ``j // l == i // l`` (the paper's A^(1)), or
* j is a "summary" key: one of the last c positions of any block,
  ``j mod l >= l - c`` (the paper's A^(2)),

and j is a real token. Positions are counted from the start of the blocked
part of the sequence (see ``global_first``).

``global_first`` (default True) reproduces LRA with CLS pooling
(``use_cls_token``): position 0 (the CLS token the encoder prepends) attends
to every real key and every query attends to it, and the block grid starts at
position 1. With ``global_first=False`` the grid starts at 0 and position 0 is
an ordinary token (for MEAN pooling).

Computed without an ``L x L`` array: block-local scores ``[B, H, L/l, l, l]``
and scores against the gathered summary keys ``[B, H, L/l, l, (L/l) c]``,
normalised by one joint softmax. A summary key in the query's own block is
dropped from the summary part (it is already in the local part), so no key
is counted twice. The summary scores are ``O(L^2 c / l)``: a constant
factor ``c / l`` (LRA: 1/5) below full attention, not linear.

Differences from LRA's code: LRA applies a causal (lower-triangular) mask on
top of the pattern even for classification, and its ``Fixed2Pattern`` also
adds the FIRST position of every block (``j mod l == 0``) as a summary key.
This module is bidirectional, as LRA's paper describes its encoders, and uses
the paper's summary set. There is no causal form.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from simpletron_jax.attention import base
from simpletron_jax.attention.local import (check_int_field, masked_softmax, scale_queries,
                                            to_blocks)


class SparseAttention(nn.Module):
  """Multi-head bidirectional Sparse Transformer attention, fixed pattern (Child et al., 2019).

  Attributes:
    num_heads: H.
    qkv_dim: D, total width of queries, keys and values over all heads.
    out_dim: O, width of the output projection.
    dropout_rate: dropout on the attention weights (the joint local +
      summary weights, and the global row).
    block_size: l, tokens per block (LRA: 50).
    num_summary: c, summary positions at the end of each block
      (``1 <= c <= l``; LRA: 10; the paper uses c in {8, 16, 32} with
      l = 128).
    global_first: if True, position 0 is global and the block grid starts at
      position 1 (LRA with a CLS token); if False, no global token.
    dtype: computation dtype; the softmax is computed in float32.
    use_bias: biases on the query, key, value and output projections (config field
      ``model.attention_bias``; LRA's attentions have none, see :func:`base.head_projection`).

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``.
  Non-causal; outputs at real positions do not depend on padding.

  Raises:
    ValueError: if ``block_size < 1`` or ``num_summary`` is not in
      ``[1, block_size]`` (naming ``model.attention_kwargs.<field>``), or
      ``qkv_dim`` is not a multiple of ``num_heads``.
  """

  num_heads: int
  qkv_dim: int
  out_dim: int
  dropout_rate: float = 0.0
  block_size: int = 50
  num_summary: int = 10
  global_first: bool = True
  dtype: base.Dtype = jnp.float32
  use_bias: bool = True

  @nn.compact
  def __call__(self, x_BxLxE, mask_BxL=None, *, deterministic: bool = True):
    check_int_field(self.block_size, "block_size", "sparse")
    check_int_field(self.num_summary, "num_summary", "sparse")
    if self.num_summary > self.block_size:
      raise ValueError(f"model.attention_kwargs.num_summary={self.num_summary} must be <= "
                       f"model.attention_kwargs.block_size={self.block_size} for attention "
                       "'sparse'")
    length = x_BxLxE.shape[1]
    mask_BxL = base.default_mask(x_BxLxE, mask_BxL)
    q, k, v = base.project_qkv(x_BxLxE, self.num_heads, self.qkv_dim, self.dtype,
                               use_bias=self.use_bias)
    q = scale_queries(q)
    start = 1 if self.global_first else 0   # the block grid starts here
    l, c = self.block_size, self.num_summary

    q_BxNxlxHxK = to_blocks(q[:, start:], l)
    k_BxNxlxHxK = to_blocks(k[:, start:], l)
    v_BxNxlxHxK = to_blocks(v[:, start:], l)
    real_BxNxl = to_blocks(mask_BxL[:, start:], l, False)
    batch, num_blocks = real_BxNxl.shape[:2]

    # Local part: keys of the query's own block.
    local_BxHxNxlxl = jnp.einsum("bnqhd,bnkhd->bhnqk", q_BxNxlxHxK, k_BxNxlxHxK)
    keep_local = real_BxNxl[:, None, :, None, :]

    # Summary part: the last c positions of every block, minus the query's own block.
    k_BxSxHxK = k_BxNxlxHxK[:, :, l - c:].reshape((batch, num_blocks * c) + k.shape[2:])
    v_BxSxHxK = v_BxNxlxHxK[:, :, l - c:].reshape((batch, num_blocks * c) + v.shape[2:])
    real_BxS = real_BxNxl[:, :, l - c:].reshape(batch, num_blocks * c)
    block_of_S = jnp.repeat(jnp.arange(num_blocks), c)
    other_block_NxS = block_of_S[None, :] != jnp.arange(num_blocks)[:, None]
    summary_BxHxNxlxS = jnp.einsum("bnqhd,bshd->bhnqs", q_BxNxlxHxK, k_BxSxHxK)
    keep_summary = real_BxS[:, None, None, None, :] & other_block_NxS[None, None, :, None, :]

    logits = [local_BxHxNxlxl, summary_BxHxNxlxS]
    keeps = [keep_local, keep_summary]
    if self.global_first:
      # Every query also sees key 0 (outside the block grid, so never counted twice).
      logits.append(jnp.einsum("bnqhd,bhd->bhnq", q_BxNxlxHxK, k[:, 0])[..., None])
      keeps.append(mask_BxL[:, 0, None, None, None, None])
    keeps = [jnp.broadcast_to(keep, logit.shape) for keep, logit in zip(keeps, logits)]
    weights = masked_softmax(jnp.concatenate(logits, -1), jnp.concatenate(keeps, -1),
                             self.dtype)
    weights = nn.Dropout(self.dropout_rate)(weights, deterministic=deterministic)
    w_local, w_summary = weights[..., :l], weights[..., l:l + num_blocks * c]
    y_BxNxlxHxK = (jnp.einsum("bhnqk,bnkhd->bnqhd", w_local, v_BxNxlxHxK)
                   + jnp.einsum("bhnqs,bshd->bnqhd", w_summary, v_BxSxHxK))
    if self.global_first:
      y_BxNxlxHxK = y_BxNxlxHxK + jnp.einsum("bhnq,bhd->bnqhd", weights[..., -1], v[:, 0])
    y_BxLxHxK = y_BxNxlxHxK.reshape((batch, -1) + q.shape[2:])[:, :length - start]

    if self.global_first:
      # Global row: position 0 attends to every real key.
      row_BxHxL = jnp.einsum("bhd,blhd->bhl", q[:, 0], k)
      row_BxHxL = masked_softmax(row_BxHxL, mask_BxL[:, None, :], self.dtype)
      row_BxHxL = nn.Dropout(self.dropout_rate)(row_BxHxL, deterministic=deterministic)
      y0_Bx1xHxK = jnp.einsum("bhl,blhd->bhd", row_BxHxL, v)[:, None]
      y_BxLxHxK = jnp.concatenate([y0_Bx1xHxK, y_BxLxHxK], axis=1)
    return base.output_projection(y_BxLxHxK, self.out_dim, self.dtype, use_bias=self.use_bias)
