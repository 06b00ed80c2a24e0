"""Sparse Transformer attention with the "fixed" pattern, as LRA computes it.

Child et al., "Generating Long Sequences with Sparse Transformers" (2019),
sec. 4.3, the fixed pattern with both of its parts merged into every head,
as in LRA (``models/sparse_transformer/sparse_attention.py``, patterns
``Fixed1Pattern`` + ``Fixed2Pattern`` with ``block_size=50, c=10`` set in
``utils/train_utils.py``). With block length ``l = block_size`` and
``c = num_summary``, query i attends to key j iff

* j is in i's block: ``j // l == i // l`` (``Fixed1Pattern``, the paper's A^(1)), or
* j is a "summary" key of any block: ``j mod l == 0`` or ``j mod l >= l - c``
  (``Fixed2Pattern``; the paper's A^(2) has only the last c positions, LRA's
  code adds the first position of every block: LRA's choice, kept),

and j is a real token. Positions are counted from the start of the blocked
part of the sequence (see ``global_first``).

``global_first`` (default True) is LRA's ``use_cls_token``, which LRA's encoder
sets exactly when the pooling is CLS: position 0 (the CLS token the encoder
prepends; in LRA's dual encoder, which prepends none, the first token) attends
to every real key and every query attends to it, and the block grid starts at
position 1. With ``global_first=False`` the grid starts at 0 and position 0 is
an ordinary token (LRA with MEAN pooling).

Computed without an ``L x L`` array: block-local scores ``[B, H, L/l, l, l]``
and scores against the gathered summary keys ``[B, H, L/l, l, (L/l) s]``
(``s = c + 1`` summary positions per block, or l when ``c = l``), normalised by
one joint softmax. A summary key in the query's own block is dropped from the
summary part (it is already in the local part), so no key is counted twice.
The summary scores are ``O(L^2 s / l)``: a constant factor ``s / l`` (LRA:
11/50) below full attention, not linear.

LRA's bugs, reproduced by ``lra_bugs=True`` (docs/lra_parity.md): LRA's
``_build_mask`` AND-s every fixed pattern with a causal mask ``j <= i`` (code
written for language models, used by LRA's classifiers too; the global row and
column of ``global_first`` stay whole), and its padding mask masks queries as
well as keys with a ``-1e10`` bias, so a pad query's row is uniform over all L
keys (pads included). By default the pattern is bidirectional, as LRA's paper
describes its encoders.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from simpletron_jax.model.attention import base, registry
from simpletron_jax.model.attention.local import (check_int_field, masked_softmax, scale_queries,
                                                  to_blocks)


def summary_offsets(block_size: int, num_summary: int) -> list[int]:
  """The in-block offsets of LRA's summary keys (``Fixed2Pattern`` in
  ``models/sparse_transformer/sparse_attention.py``): ``0`` and ``l - c .. l - 1``, sorted,
  without repeats (``c = l`` gives every offset)."""
  return sorted({0, *range(block_size - num_summary, block_size)})


class SparseAttention(base.Attention):
  """Multi-head Sparse Transformer attention, LRA's fixed pattern (Child et al., 2019).

  Fields: :class:`base.Attention`'s ``num_heads`` (H), ``qkv_dim`` (D, over all heads),
  ``out_dim`` (O), ``use_bias`` and ``dense_init`` (of the ``query``, ``key``, ``value`` and
  ``out`` projections), then ``dropout_rate``, ``dtype`` and its own options:

  Attributes:
    dropout_rate: dropout on the attention weights (the joint local +
      summary weights, and the global row).
    block_size: l, tokens per block (LRA: 50).
    num_summary: c, summary positions at the end of each block
      (``1 <= c <= l``; LRA: 10; the paper uses c in {8, 16, 32} with
      l = 128). The first position of each block is a summary key too (LRA).
    global_first: if True, position 0 is global and the block grid starts at
      position 1 (LRA's ``use_cls_token``, on with CLS pooling); if False, no
      global token (LRA with MEAN pooling). The configs set it from
      ``model.classifier_pool``.
    dtype: computation dtype; the softmax is computed in float32.
    lra_bugs: reproduce LRA's ``models/sparse_transformer/sparse_attention.py`` (config
      field ``model.attention_kwargs.lra_bugs``): the fixed pattern AND a causal mask
      ``j <= i`` (the global row and column stay whole), and pad queries uniform over
      all L keys (LRA's query AND key padding mask as a ``-1e10`` bias; here without
      attention dropout on those rows). False (default): bidirectional, pads only
      masked as keys.

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``.
  Outputs at real positions do not depend on padding.

  Raises:
    ValueError: if ``block_size < 1`` or ``num_summary`` is not in
      ``[1, block_size]`` (naming ``model.attention_kwargs.<field>``), or
      ``qkv_dim`` is not a multiple of ``num_heads``.
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

    # Summary part: the summary offsets of every block but the query's own (LRA's bug:
    # of the blocks before it).
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
      # Global row: position 0 attends to every real key.
      row_BxHxL = jnp.einsum("bhd,blhd->bhl", q[:, 0], k)
      row_BxHxL = masked_softmax(row_BxHxL, mask_BxL[:, None, :], self.dtype)
      row_BxHxL = nn.Dropout(self.dropout_rate)(row_BxHxL, deterministic=deterministic)
      y0_Bx1xHxK = jnp.einsum("bhl,blhd->bhd", row_BxHxL, v)[:, None]
      y_BxLxHxK = jnp.concatenate([y0_Bx1xHxK, y_BxLxHxK], axis=1)
    if self.lra_bugs:
      # LRA masks pad queries too: every logit of their row gets -1e10, so the row is
      # uniform over all L keys.
      mean_Bx1xHxK = v.mean(axis=1, keepdims=True)
      y_BxLxHxK = jnp.where(mask_BxL[:, :, None, None], y_BxLxHxK, mean_Bx1xHxK)
    return self.project_out(y_BxLxHxK)


registry.register(registry.AttentionSpec(
    "sparse", SparseAttention, paper="Child et al., Sparse Transformers, fixed pattern (2019)"))
