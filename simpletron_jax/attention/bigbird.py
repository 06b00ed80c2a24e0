"""BigBird attention: block window + global first block + random blocks.

Zaheer et al., "Big Bird: Transformers for Longer Sequences" (2020), the
blocked ITC form, as in LRA (``models/bigbird/bigbird_attention.py``, block 64,
3 random blocks). The length is padded internally to ``N`` blocks of
``b = block_size`` tokens. For query block n:

* n = 0 is GLOBAL (it holds the CLS token the encoder prepends, or the first
  tokens with MEAN pooling): its queries attend to every real key;
* n >= 1 attends to the window blocks n-1, n, n+1, to the global block 0, and
  to ``num_random_blocks`` random blocks drawn from the other real blocks.

Each key appears once per query: block 0 is always scored through the global
part (never through the window), and random blocks are drawn from the
blocks outside ``{0, n-1, n, n+1}``. Only real keys get weight. Scores are
``[B, H, N, b, (4 + r) b]`` plus ``[B, H, b, L]`` for the global block: linear
in L.

Random blocks (:func:`random_blocks`): for head h and query block n, r fixed
uniforms (:func:`pattern_uniforms`, numpy at trace time, seeded by
``random_seed`` and a CRC-32 of the module path) are mapped to a draw without
replacement among the candidates: the blocks ``j < R`` outside
``{0, n-1, n, n+1}``, where ``R`` is the example's number of REAL key blocks
(blocks up to the last real token). The draw depends only on
``(seed, layer, h, n, R)``: appending padding never changes which blocks a
real query sees (padding invariance). With fewer than r candidates, all of
them are taken. The pattern is FIXED across training steps (as in LRA, which
seeds numpy once per layer) and differs between heads and between layers.
The chosen blocks are sown into the ``"intermediates"`` collection as
``random_blocks`` (``[B, H, N, min(r, N)]`` int32, -1 for none).

Differences from LRA's code: LRA (like the paper's ITC) also makes the LAST
block global, and draws its random blocks over the padded length, so they
can land on padding and change when padding is added. A "last" block moves
with the padding, so only the first block is global here, and the draw only
sees real blocks. Non-causal (LRA's
encoders are bidirectional; LRA falls back to full attention for causal);
there is no causal form.
"""

from __future__ import annotations

import zlib
from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from simpletron_jax.attention import base
from simpletron_jax.attention.local import (check_int_field, masked_softmax, scale_queries,
                                            to_blocks, with_neighbours)


def pattern_uniforms(random_seed: int, path: Sequence[str], num_blocks: int, num_heads: int,
                     num_random_blocks: int) -> np.ndarray:
  """The fixed uniforms behind one layer's random blocks, computed in numpy at trace time.

  Draws ``N * H * r`` doubles from ``numpy.random.default_rng([random_seed,
  crc32(path)])`` in the order (query block n, head h, draw t), so the value for
  ``(n, h, t)`` sits at stream position ``(n H + h) r + t`` and does not depend on
  N: more (padding) blocks only append values.

  Args:
    random_seed: ``model.attention_kwargs.random_seed`` (``>= 0``).
    path: the Flax module path (``module.path``; ``()`` for a top-level module),
      so that layers differ.
    num_blocks: N.
    num_heads: H.
    num_random_blocks: r.

  Returns:
    ``[H, N, r]`` float64 in ``[0, 1)``.
  """
  path_hash = zlib.crc32("/".join(path).encode())
  rng = np.random.default_rng([random_seed, path_hash])
  u_NxHxr = rng.random((num_blocks, num_heads, num_random_blocks))
  return u_NxHxr.transpose(1, 0, 2)


def num_real_blocks(mask_BxL: jnp.ndarray, block_size: int) -> jnp.ndarray:
  """Blocks up to and including the one holding the last real token.

  Args:
    mask_BxL: bool, True for real tokens.
    block_size: b.

  Returns:
    ``[B]`` int32, ``ceil((last real index + 1) / b)``; 0 for an all-pad row.
  """
  end_B = jnp.max(jnp.where(mask_BxL, jnp.arange(1, mask_BxL.shape[1] + 1), 0), axis=1)
  return (end_B + block_size - 1) // block_size


def random_blocks(uniforms_HxNxr: np.ndarray, num_real_blocks_B: jnp.ndarray) -> jnp.ndarray:
  """Draws the random key blocks of every query block (padding invariant).

  For head h and query block n the candidates are the R real key blocks minus
  ``{0, n-1, n, n+1}`` (C of them). Draw t (``t = 0 .. r-1``) maps the uniform
  ``u[h, n, t]`` to the ``floor(u * (C - t))``-th candidate not yet taken (in
  increasing order): sampling without replacement that depends only on
  ``(u, R)``. Memory is ``O(B H N r)``; no ``N x N`` array is built.

  Args:
    uniforms_HxNxr: from :func:`pattern_uniforms`.
    num_real_blocks_B: ``[B]`` int, R per example (:func:`num_real_blocks`).

  Returns:
    ``[B, H, N, min(r, N)]`` int32 block indices in draw order; ``-1`` where
    the candidates ran out. Valid entries are distinct, ``< R`` and outside
    ``{0, n-1, n, n+1}`` for query block n.
  """
  num_heads, num_blocks, num_random_blocks = uniforms_HxNxr.shape
  r = min(num_random_blocks, num_blocks)
  batch = num_real_blocks_B.shape[0]
  if r == 0:
    return jnp.zeros((batch, num_heads, num_blocks, 0), jnp.int32)

  u_HxNxr = jnp.asarray(uniforms_HxNxr[:, :, :r], jnp.float32)
  real_Bx1x1 = num_real_blocks_B.astype(jnp.int32)[:, None, None]
  n_1x1xN = jnp.arange(num_blocks, dtype=jnp.int32)[None, None, :]
  never = num_blocks + 1  # sentinel above every block index
  # The excluded blocks {0, n-1, n, n+1}, distinct, restricted to [0, R); sentinel if absent.
  excluded = [jnp.zeros_like(n_1x1xN), jnp.where(n_1x1xN >= 2, n_1x1xN - 1, never),
              jnp.where(n_1x1xN >= 1, n_1x1xN, never), n_1x1xN + 1]
  excluded = [jnp.broadcast_to(jnp.where(e < real_Bx1x1, e, never), (batch, 1, num_blocks))
              for e in excluded]
  num_candidates_Bx1xN = real_Bx1x1 - sum((e < never).astype(jnp.int32) for e in excluded)
  taken = [jnp.broadcast_to(e, (batch, num_heads, num_blocks)) for e in excluded]
  picks = []
  for t in range(r):
    left_Bx1xN = num_candidates_Bx1xN - t
    rank_BxHxN = jnp.floor(u_HxNxr[None, :, :, t] * left_Bx1xN).astype(jnp.int32)
    rank_BxHxN = jnp.clip(rank_BxHxN, 0, jnp.maximum(left_Bx1xN - 1, 0))
    # The rank-th block not in `taken`: step over the taken blocks in increasing order.
    pick_BxHxN = rank_BxHxN
    for e in jnp.unstack(jnp.sort(jnp.stack(taken, -1), axis=-1), axis=-1):
      pick_BxHxN = pick_BxHxN + (e <= pick_BxHxN).astype(jnp.int32)
    pick_BxHxN = jnp.where(left_Bx1xN > 0, pick_BxHxN, never)
    taken.append(pick_BxHxN)
    picks.append(jnp.where(left_Bx1xN > 0, pick_BxHxN, -1))
  return jnp.stack(picks, -1)


class BigBirdAttention(nn.Module):
  """Multi-head BigBird block-sparse attention (Zaheer et al., 2020).

  Attributes:
    num_heads: H.
    qkv_dim: D, total width of queries, keys and values over all heads.
    out_dim: O, width of the output projection.
    dropout_rate: dropout on the attention weights (the joint window +
      global + random weights, and the global block's rows).
    block_size: b, tokens per block (LRA: 64).
    num_random_blocks: r, random key blocks per query block (LRA: 3; 0
      disables them).
    random_seed: seed of the fixed random pattern (see the module docstring).
    dtype: computation dtype; the softmax is computed in float32.
    use_bias: biases on the query, key, value and output projections (config field
      ``model.attention_bias``; LRA's attentions have none, see :func:`base.head_projection`).

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``.
  Non-causal; outputs at real positions do not depend on padding.

  Raises:
    ValueError: if ``block_size < 1``, ``num_random_blocks < 0`` or
      ``random_seed < 0`` (naming ``model.attention_kwargs.<field>``), or
      ``qkv_dim`` is not a multiple of ``num_heads``.
  """

  num_heads: int
  qkv_dim: int
  out_dim: int
  dropout_rate: float = 0.0
  block_size: int = 64
  num_random_blocks: int = 3
  random_seed: int = 0
  dtype: base.Dtype = jnp.float32
  use_bias: bool = True

  @nn.compact
  def __call__(self, x_BxLxE, mask_BxL=None, *, deterministic: bool = True):
    check_int_field(self.block_size, "block_size", "bigbird")
    check_int_field(self.num_random_blocks, "num_random_blocks", "bigbird", minimum=0)
    check_int_field(self.random_seed, "random_seed", "bigbird", minimum=0)
    length = x_BxLxE.shape[1]
    mask_BxL = base.default_mask(x_BxLxE, mask_BxL)
    q, k, v = base.project_qkv(x_BxLxE, self.num_heads, self.qkv_dim, self.dtype,
                               use_bias=self.use_bias)
    q = scale_queries(q)
    b = self.block_size
    q_BxNxbxHxK, k_BxNxbxHxK, v_BxNxbxHxK = (to_blocks(t, b) for t in (q, k, v))
    real_BxNxb = to_blocks(mask_BxL, b, False)
    batch, num_blocks = real_BxNxb.shape[:2]
    heads = q.shape[2]

    # Window: blocks n-1, n, n+1, except block 0 (scored as the global block).
    k_BxNx3bxHxK = with_neighbours(k_BxNxbxHxK)
    v_BxNx3bxHxK = with_neighbours(v_BxNxbxHxK)
    win_block_Nx3b = jnp.repeat(jnp.arange(num_blocks)[:, None] + jnp.arange(-1, 2)[None, :],
                                b, axis=1)
    keep_window = (with_neighbours(real_BxNxb)[:, None, :, None, :]
                   & (win_block_Nx3b > 0)[None, None, :, None, :])
    window_logits = jnp.einsum("bnqhd,bnkhd->bhnqk", q_BxNxbxHxK, k_BxNx3bxHxK)

    # Global block 0 as keys of every query block.
    global_logits = jnp.einsum("bnqhd,bkhd->bhnqk", q_BxNxbxHxK, k_BxNxbxHxK[:, 0])
    keep_global = real_BxNxb[:, 0][:, None, None, None, :]

    # Random blocks, gathered per (example, head, query block).
    uniforms_HxNxr = pattern_uniforms(self.random_seed, self.path, num_blocks, heads,
                                      self.num_random_blocks)
    idx_BxHxNxr = random_blocks(uniforms_HxNxr, num_real_blocks(mask_BxL, b))
    self.sow("intermediates", "random_blocks", idx_BxHxNxr)
    r = idx_BxHxNxr.shape[-1]
    flat_BxHxNr = jnp.maximum(idx_BxHxNxr, 0).reshape(batch, heads, num_blocks * r)

    def gather(t_BxNxbxHxK):
      t_BxHxNxbxK = t_BxNxbxHxK.transpose(0, 3, 1, 2, 4)
      got = jnp.take_along_axis(t_BxHxNxbxK, flat_BxHxNr[..., None, None], axis=2)
      return got.reshape(batch, heads, num_blocks, r * b, t_BxNxbxHxK.shape[-1])

    k_BxHxNxRbxK, v_BxHxNxRbxK = gather(k_BxNxbxHxK), gather(v_BxNxbxHxK)
    real_BxHxNrxb = jnp.take_along_axis(
        jnp.broadcast_to(real_BxNxb[:, None], (batch, heads, num_blocks, b)),
        flat_BxHxNr[..., None], axis=2)
    real_BxHxNxRb = (real_BxHxNrxb.reshape(batch, heads, num_blocks, r, b)
                     & (idx_BxHxNxr >= 0)[..., None]).reshape(batch, heads, num_blocks, r * b)
    random_logits = jnp.einsum("bnqhd,bhnkd->bhnqk", q_BxNxbxHxK, k_BxHxNxRbxK)
    keep_random = real_BxHxNxRb[:, :, :, None, :]

    logits = [window_logits, global_logits, random_logits]
    keeps = [jnp.broadcast_to(keep, logit.shape)
             for keep, logit in zip([keep_window, keep_global, keep_random], logits)]
    weights = masked_softmax(jnp.concatenate(logits, -1), jnp.concatenate(keeps, -1),
                             self.dtype)
    weights = nn.Dropout(self.dropout_rate)(weights, deterministic=deterministic)
    w_window, w_global, w_random = (weights[..., :3 * b], weights[..., 3 * b:4 * b],
                                    weights[..., 4 * b:])
    y_BxNxbxHxK = (jnp.einsum("bhnqk,bnkhd->bnqhd", w_window, v_BxNx3bxHxK)
                   + jnp.einsum("bhnqk,bkhd->bnqhd", w_global, v_BxNxbxHxK[:, 0])
                   + jnp.einsum("bhnqk,bhnkd->bnqhd", w_random, v_BxHxNxRbxK))

    # Global block 0 as queries: every real key.
    rows_BxHxbxL = masked_softmax(jnp.einsum("bqhd,blhd->bhql", q_BxNxbxHxK[:, 0], k),
                                  mask_BxL[:, None, None, :], self.dtype)
    rows_BxHxbxL = nn.Dropout(self.dropout_rate)(rows_BxHxbxL, deterministic=deterministic)
    y_BxNxbxHxK = y_BxNxbxHxK.at[:, 0].set(jnp.einsum("bhql,blhd->bqhd", rows_BxHxbxL, v))
    y_BxLxHxK = y_BxNxbxHxK.reshape((batch, num_blocks * b) + q.shape[2:])[:, :length]
    return base.output_projection(y_BxLxHxK, self.out_dim, self.dtype, use_bias=self.use_bias)
