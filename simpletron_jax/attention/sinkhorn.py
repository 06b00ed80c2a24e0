"""Sparse Sinkhorn attention: block-local attention plus a learned soft sorting of blocks.

Tay et al., "Sparse Sinkhorn Attention" (ICML 2020); the LRA "Sinkhorn Transformer"
baseline (``lra_benchmarks/models/sinkhorn_transformer/sinkhorn_attention.py``).

The length is split into ``N = ceil(L / b)`` blocks of ``b = block_size`` tokens. Per
head:

1. Block summary: the masked mean of the keys of each block, ``s_i`` (``[N, K]``).
2. Sorting network: one dense layer ``sort_net`` from ``K`` to ``ceil(max_length / b)``
   outputs, sliced to ``N``: ``R_ij = (W s_i + c)_j``, the paper's ``F_P``.
3. Sinkhorn normalisation in log space (paper sec. 3.2), ``sinkhorn_iters`` times
   (each iteration normalises rows, then columns) of ``R / temperature``, gives a
   soft permutation ``P`` (``[N, N]``, close to doubly stochastic).
4. The sorted keys and values of block i are ``sum_j P_ij K_j`` and ``sum_j P_ij V_j``.
5. Each query attends to the ``b`` keys of its own block and the ``b`` sorted keys of
   its block with ONE joint softmax, ``softmax([q K_i^T, q (PK)_i^T] / sqrt(d))``.

Memory: the block logits are ``[B, H, N, b, 2b]`` and ``P`` is ``[B, H, N, N]``, so
O(L b + (L/b)^2), with no ``L x L`` array.

Padding: pad keys and values are zeroed and pad keys get zero weight. A block with no
real token is left out of the Sinkhorn iterations (its row and column of ``R`` are
masked), so real blocks' permutation does not depend on how much padding follows. A
slot t of a sorted block is a real key when some real block has a real token at slot
t (only the last real block can be partial).

Differences from LRA's code, which (a) reshapes ``[L]`` to ``[b, N]``, so its "blocks"
are strided, not contiguous, (b) mixes the blocks with an einsum that sums keys and
permutation separately (every sorted block is the sum of all blocks), (c) uses a row
softmax, not Sinkhorn, by default (``sort_activation='softmax'``; its operator's
default is one iteration with clipping to [-1, 1]), and (d) sums two separately
normalised softmaxes. It sums the keys of a block (the mean is used here, so partial
blocks are on the same scale), and its sorting network has a fixed
``max_num_blocks = 25`` outputs (here ``ceil(max_length / block_size)``, so every block
of the longest input can be sorted anywhere).

LRA defaults taken: ``block_size = 50`` (``sinkhorn_transformer.py`` and
``sinkhorn_attention.py``), temperature 1.0 (``sinkhorn_operator``). ``sinkhorn_iters``
defaults to 5 (not an LRA value: LRA never runs Sinkhorn).

Causal form: none; the variant is used bidirectionally, as in LRA.

Config note: set ``model.attention_kwargs.max_length = model.max_length + 1`` (the
CLS token); the default is 2048.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from simpletron_jax.attention import base

# Finite "minus infinity" for masked log-space entries and logits (keeps gradients finite).
NEG = -1e30


def log_sinkhorn(log_alpha_XxNxN: jnp.ndarray, valid_XxN: jnp.ndarray,
                 num_iters: int) -> jnp.ndarray:
  """Masked Sinkhorn normalisation in log space (Tay et al., 2020, sec. 3.2).

  Each iteration subtracts the logsumexp of every row, then of every column, over the
  valid entries only: entry ``(i, j)`` is valid when ``valid[i]`` and ``valid[j]``.
  On the valid sub-matrix ``exp(result)`` tends to a doubly stochastic matrix.

  Args:
    log_alpha_XxNxN: float32 ``[..., N, N]`` logits (already divided by the
      temperature).
    valid_XxN: bool ``[..., N]``: which rows and columns take part.
    num_iters: number of (row, column) normalisation rounds, >= 1.

  Returns:
    ``[..., N, N]`` float32 log of the soft permutation, ``NEG`` at invalid entries.
  """
  valid_XxNxN = valid_XxN[..., :, None] & valid_XxN[..., None, :]

  def normalise(log_p, axis):
    # Rows/columns with no valid entry get a finite lse (NEG + log N) and stay NEG.
    lse = jax.nn.logsumexp(log_p, axis=axis, keepdims=True)
    return jnp.where(valid_XxNxN, log_p - lse, NEG)

  def one_round(_, log_p):
    return normalise(normalise(log_p, -1), -2)  # rows, then columns

  log_p = jnp.where(valid_XxNxN, log_alpha_XxNxN.astype(jnp.float32), NEG)
  # A static trip count: lowered to a scan, so it is differentiable.
  return jax.lax.fori_loop(0, num_iters, one_round, log_p)


class SinkhornAttention(nn.Module):
  """Multi-head sparse Sinkhorn self-attention (Tay et al., 2020); non-causal.

  Attributes:
    num_heads: H.
    qkv_dim: D, total width of queries, keys and values over all heads.
    out_dim: O, width of the output projection.
    dropout_rate: dropout on the ``[B, H, N, b, 2b]`` attention weights.
    block_size: b, tokens per block (LRA: 50).
    max_length: the longest input; sets the sorting network's output width
      ``ceil(max_length / block_size)``. Configs must set
      ``model.attention_kwargs.max_length = model.max_length + 1``.
    sinkhorn_iters: Sinkhorn normalisation rounds (>= 1).
    temperature: the sorting logits are divided by it (> 0; LRA: 1.0).
    dtype: computation dtype; the sorting and the softmax are float32.
    use_bias: biases on the query, key, value and output projections (config field
      ``model.attention_bias``; LRA's attentions have none, see :func:`base.head_projection`).

  Parameters besides ``query``/``key``/``value``/``out``: ``sort_net`` (a ``Dense``
  from the head width K to ``ceil(max_length / block_size)``, shared by the heads, as
  in LRA).

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``. The soft
  permutation is sown into ``"intermediates"`` as ``permutation_BxHxNxN``.

  Raises:
    ValueError: if the input is longer than ``max_length`` (naming
      ``model.attention_kwargs.max_length``), or ``block_size``, ``sinkhorn_iters``
      or ``temperature`` is out of range (naming the field).
  """

  num_heads: int
  qkv_dim: int
  out_dim: int
  dropout_rate: float = 0.0
  block_size: int = 50
  max_length: int = 2048
  sinkhorn_iters: int = 5
  temperature: float = 1.0
  dtype: base.Dtype = jnp.float32
  use_bias: bool = True

  def _check(self, length: int):
    if self.block_size < 1:
      raise ValueError(f"model.attention_kwargs.block_size={self.block_size} must be >= 1 "
                       "for sinkhorn")
    if self.sinkhorn_iters < 1:
      raise ValueError(f"model.attention_kwargs.sinkhorn_iters={self.sinkhorn_iters} must be "
                       ">= 1 for sinkhorn")
    if not self.temperature > 0:
      raise ValueError(f"model.attention_kwargs.temperature={self.temperature} must be > 0 "
                       "for sinkhorn")
    base.check_max_length("sinkhorn", length, self.max_length)

  @nn.compact
  def __call__(self, x_BxLxE, mask_BxL=None, *, deterministic: bool = True):
    batch, length = x_BxLxE.shape[:2]
    self._check(length)
    mask_BxL = base.default_mask(x_BxLxE, mask_BxL)
    q, k, v = base.project_qkv(x_BxLxE, self.num_heads, self.qkv_dim, self.dtype,
                               use_bias=self.use_bias)
    heads, head_dim = q.shape[-2:]
    b = self.block_size
    n = -(-length // b)
    max_blocks = -(-self.max_length // b)

    # Pad to N * b (the extra slots are masked) and cut into blocks.
    extra = n * b - length
    mask_BxL = jnp.pad(mask_BxL, ((0, 0), (0, extra)))
    real_BxLx1x1 = mask_BxL[:, :, None, None]

    def blocks(t_BxLxHxK):
      t_BxLxHxK = jnp.pad(t_BxLxHxK, ((0, 0), (0, extra), (0, 0), (0, 0)))
      t_BxLxHxK = jnp.where(real_BxLx1x1, t_BxLxHxK, 0.0)
      return t_BxLxHxK.reshape(batch, n, b, heads, head_dim)

    q_BxNxSxHxK, k_BxNxSxHxK, v_BxNxSxHxK = blocks(q), blocks(k), blocks(v)
    mask_BxNxS = mask_BxL.reshape(batch, n, b)
    valid_BxN = jnp.any(mask_BxNxS, axis=-1)

    # Sorting network on the masked mean of each block's keys.
    count_BxNx1x1 = jnp.maximum(jnp.sum(mask_BxNxS, axis=-1), 1)[:, :, None, None]
    summary_BxNxHxK = (jnp.sum(k_BxNxSxHxK.astype(jnp.float32), axis=2) / count_BxNx1x1)
    sort_BxNxHxM = nn.Dense(max_blocks, kernel_init=base.KERNEL_INIT, bias_init=base.BIAS_INIT,
                            dtype=jnp.float32, name="sort_net")(summary_BxNxHxK)
    logits_BxHxNxN = jnp.transpose(sort_BxNxHxM[..., :n], (0, 2, 1, 3))
    log_p = log_sinkhorn(logits_BxHxNxN / self.temperature, valid_BxN[:, None, :],
                         self.sinkhorn_iters)
    p_BxHxNxN = jnp.exp(log_p)  # exactly 0 at masked entries
    self.sow("intermediates", "permutation_BxHxNxN", p_BxHxNxN)

    p_cast = p_BxHxNxN.astype(self.dtype)
    sk_BxNxSxHxK = jnp.einsum("bhij,bjshk->bishk", p_cast, k_BxNxSxHxK)
    sv_BxNxSxHxK = jnp.einsum("bhij,bjshk->bishk", p_cast, v_BxNxSxHxK)
    sorted_real_BxHxNxS = jnp.einsum("bhij,bjs->bhis", p_BxHxNxN,
                                     mask_BxNxS.astype(jnp.float32)) > 0

    q_BxNxSxHxK = q_BxNxSxHxK / jnp.sqrt(head_dim).astype(self.dtype)
    local_BxHxNxSxS = jnp.einsum("bishk,bithk->bhist", q_BxNxSxHxK, k_BxNxSxHxK)
    sorted_BxHxNxSxS = jnp.einsum("bishk,bithk->bhist", q_BxNxSxHxK, sk_BxNxSxHxK)
    local_BxHxNxSxS = jnp.where(mask_BxNxS[:, None, :, None, :],
                                local_BxHxNxSxS.astype(jnp.float32), NEG)
    sorted_BxHxNxSxS = jnp.where(sorted_real_BxHxNxS[:, :, :, None, :],
                                 sorted_BxHxNxSxS.astype(jnp.float32), NEG)
    logits_BxHxNxSx2S = jnp.concatenate([local_BxHxNxSxS, sorted_BxHxNxSxS], axis=-1)
    w_BxHxNxSx2S = jax.nn.softmax(logits_BxHxNxSx2S, axis=-1).astype(self.dtype)
    w_BxHxNxSx2S = nn.Dropout(self.dropout_rate)(w_BxHxNxSx2S, deterministic=deterministic)
    y_BxNxSxHxK = (jnp.einsum("bhist,bithk->bishk", w_BxHxNxSx2S[..., :b], v_BxNxSxHxK)
                   + jnp.einsum("bhist,bithk->bishk", w_BxHxNxSx2S[..., b:], sv_BxNxSxHxK))
    y_BxLxHxK = y_BxNxSxHxK.reshape(batch, n * b, heads, head_dim)[:, :length]
    return base.output_projection(y_BxLxHxK, self.out_dim, self.dtype, use_bias=self.use_bias)
