"""Sparse Transformer attention, the "fixed" pattern (Child et al., 2019), as LRA computes it.

LRA's ``models/sparse_transformer/sparse_attention.py`` (``Fixed1Pattern`` + ``Fixed2Pattern``
in every head, ``block_size=50, c=10``). With ``l = block_size``, ``c = num_summary``, query i
attends to real key j iff ``j // l == i // l`` or j is a summary key, ``j mod l == 0`` (LRA's
addition) or ``j mod l >= l - c``. ``global_first`` (LRA's ``use_cls_token``, set with CLS
pooling) makes position 0 global and starts the grid at 1.

No ``L x L`` array: block scores ``[B, H, L/l, l, l]`` and summary scores
``[B, H, L/l, l, (L/l) s]`` under one softmax, a summary key of the query's own block
counted once; ``O(L^2 s / l)``, a factor ``s / l`` (LRA: 11/50) below full attention.
``lra_bugs``: LRA's causal AND-ed pattern and pad-query rows (docs/lra_parity.md).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from simpletron_jax.model.attention import base, registry
from simpletron_jax.model.attention.local import (check_int_field, masked_softmax, scale_queries,
                                                  to_blocks)


def summary_offsets(block_size: int, num_summary: int) -> list[int]:
  """LRA's in-block summary offsets ``0`` and ``l - c .. l - 1``, sorted, no repeats."""
  return sorted({0, *range(block_size - num_summary, block_size)})


class SparseAttention(base.Attention):
  """LRA's fixed-pattern sparse attention (:class:`base.Attention`'s fields, then its own).

  Attributes:
    dropout_rate: dropout on the joint local + summary weights and the global row.
    block_size: l, tokens per block (LRA: 50).
    num_summary: c, ``1 <= c <= l`` (LRA: 10; the paper 8 to 32 with l = 128).
    global_first: position 0 global, grid from 1 (set from ``model.classifier_pool``).
    lra_bugs: LRA's pattern AND a causal mask ``j <= i`` (global row and column whole), and
      pad queries uniform over all L keys (here without dropout on those rows).

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``; softmax in float32.

  Raises:
    ValueError: ``block_size < 1`` or ``num_summary`` outside ``[1, block_size]``, naming the
      field, or bad ``qkv_dim``.
  """

  block_size: int = 50
  num_summary: int = 10
  global_first: bool = True
  lra_bugs: bool = False

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
    q, k, v = self.project_qkv(x_BxLxE)
    q = scale_queries(q)
    start = 1 if self.global_first else 0   # the block grid starts here
    l = self.block_size
    offsets = jnp.asarray(summary_offsets(l, self.num_summary))
    s = len(offsets)

    q_BxNxlxHxK = to_blocks(q[:, start:], l)
    k_BxNxlxHxK = to_blocks(k[:, start:], l)
    v_BxNxlxHxK = to_blocks(v[:, start:], l)
    real_BxNxl = to_blocks(mask_BxL[:, start:], l, False)
    batch, num_blocks = real_BxNxl.shape[:2]

    # Local part: keys of the query's own block (LRA's bug: only those up to the query).
    local_BxHxNxlxl = jnp.einsum("bnqhd,bnkhd->bhnqk", q_BxNxlxHxK, k_BxNxlxHxK)
    keep_local = real_BxNxl[:, None, :, None, :]
    if self.lra_bugs:
      keep_local = keep_local & jnp.tril(jnp.ones((l, l), bool))

    # Summary part: every block but the query's own (LRA's bug: the blocks before it).
    k_BxSxHxK = k_BxNxlxHxK[:, :, offsets].reshape((batch, num_blocks * s) + k.shape[2:])
    v_BxSxHxK = v_BxNxlxHxK[:, :, offsets].reshape((batch, num_blocks * s) + v.shape[2:])
    real_BxS = real_BxNxl[:, :, offsets].reshape(batch, num_blocks * s)
    block_of_S = jnp.repeat(jnp.arange(num_blocks), s)
    if self.lra_bugs:
      other_block_NxS = block_of_S[None, :] < jnp.arange(num_blocks)[:, None]
    else:
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
    w_local, w_summary = weights[..., :l], weights[..., l:l + num_blocks * s]
    y_BxNxlxHxK = (jnp.einsum("bhnqk,bnkhd->bnqhd", w_local, v_BxNxlxHxK)
                   + jnp.einsum("bhnqs,bshd->bnqhd", w_summary, v_BxSxHxK))
    if self.global_first:
      y_BxNxlxHxK = y_BxNxlxHxK + jnp.einsum("bhnq,bhd->bnqhd", weights[..., -1], v[:, 0])
    y_BxLxHxK = y_BxNxlxHxK.reshape((batch, -1) + q.shape[2:])[:, :length - start]

    if self.global_first:
      row_BxHxL = jnp.einsum("bhd,blhd->bhl", q[:, 0], k)
      row_BxHxL = masked_softmax(row_BxHxL, mask_BxL[:, None, :], self.dtype)
      row_BxHxL = nn.Dropout(self.dropout_rate)(row_BxHxL, deterministic=deterministic)
      y0_Bx1xHxK = jnp.einsum("bhl,blhd->bhd", row_BxHxL, v)[:, None]
      y_BxLxHxK = jnp.concatenate([y0_Bx1xHxK, y_BxLxHxK], axis=1)
    if self.lra_bugs:
      # LRA's -1e10 on every logit of a pad query's row: uniform over all L keys.
      mean_Bx1xHxK = v.mean(axis=1, keepdims=True)
      y_BxLxHxK = jnp.where(mask_BxL[:, :, None, None], y_BxLxHxK, mean_Bx1xHxK)
    return self.project_out(y_BxLxHxK)


registry.register(registry.AttentionSpec(
    "sparse", SparseAttention, paper="Child et al., Sparse Transformers, fixed pattern (2019)"))
