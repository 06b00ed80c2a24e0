"""Sparse Sinkhorn attention as LRA computes it: local attention in strided groups plus
attention to a learned soft sorting of the groups.

Tay et al., "Sparse Sinkhorn Attention" (ICML 2020); the LRA "Sinkhorn Transformer"
baseline (``lra_benchmarks/models/sinkhorn_transformer/sinkhorn_attention.py``).

The length L is padded with masked positions to ``N * b`` (``b = block_size``,
``N = ceil(L / b)``; LRA requires ``L % b == 0`` and does not pad) and reshaped, as LRA
does, to ``[B, b, N, ...]``: group n holds the positions ``{p : p mod N = n}`` (strided, not
contiguous), slot s of group n is position ``s N + n``. Per head:

1. Group summary: the sum of the keys of each group, ``s_n`` (``[N, K]``; LRA's sum).
2. Sorting network: one dense layer ``sort_net`` from ``K`` to ``M = max_num_blocks``
   outputs (LRA: 25), sliced to ``M' = min(N, M)``: ``R_nl = (W s_n + c)_l``, the
   paper's ``F_P``.
3. Sort: ``sort="softmax"`` (LRA's ``sort_activation`` default, what LRA ran) is a row
   softmax of ``R / temperature`` over the real groups l; ``sort="sinkhorn"`` is the
   paper's Sinkhorn normalisation in log space (``sinkhorn_iters`` rounds of row then
   column normalisation, over the real groups; needs ``M >= N``). Either gives ``P``
   (``[N, M']``).
4. The sorted keys and values of group n are ``sum_l P_nl K_l`` and ``sum_l P_nl V_l``.
5. Each query attends to the b keys of its own group and, separately, to the b sorted
   keys of its group: two softmaxes, each over its own b keys, whose outputs are ADDED
   (LRA's form: ``x + sorted_x``); ``joint_softmax=True`` takes one softmax over the 2b
   keys instead.

Memory: the logits are ``[B, H, N, b, b]`` twice and ``P`` is ``[B, H, N, M']``, so
O(L b + N M'), with no ``L x L`` array.

Padding (default): pad keys and values are zeroed and pad keys get zero weight; a group
with no real token is not a sort target. A slot t of a sorted group is a real key when
some group with nonzero weight in ``P`` has a real token at slot t. As N follows the
(padded) input length, the outputs at real positions depend on how far the batch is
padded (not on what the pads hold), as in LRA.

LRA's bugs, reproduced by ``lra_bugs=True`` (docs/lra_parity.md):

* the sorting einsum ``'bskhd,bnhl->bsnhd'`` sums the keys over the groups k and the
  permutation over l separately, so every sorted group is ``(sum_k K_k) * sum_l P_nl``,
  the sum of all groups (pads included), and the sort network has no effect (the same
  for the values and for the sorted mask);
* the padding mask is cut into CONTIGUOUS blocks ``[B, N, b]`` while the groups are
  strided: query s and key t of group n are allowed by the real flags of positions
  ``n b + s`` and ``n b + t`` (query AND key), and sorted key t by
  ``OR_k (real[k b + s] and real[k b + t])``; a row with no allowed key (LRA's ``-1e10``
  bias) is uniform over its b keys;
* pad keys are not zeroed, and the summaries and the sort use every group.

LRA defaults taken: ``block_size = 50`` and ``max_num_blocks = 25``
(``sinkhorn_attention.py``), ``sort="softmax"``, temperature 1.0, the separate softmaxes.
``sinkhorn_iters`` (default 5) is used only by ``sort="sinkhorn"``, which LRA never ran
(its ``sinkhorn_operator`` would run one round and clip the log-permutation to [-1, 1]).

Causal form: none; the variant is used bidirectionally, as in LRA.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from simpletron_jax.model.attention import base, registry

# Finite "minus infinity" for masked log-space entries and logits (keeps gradients finite).
# A row with every entry masked comes out uniform, as LRA's -1e10 bias makes it.
NEG = -1e30
SORTS = ("softmax", "sinkhorn")


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


class SinkhornAttention(base.Attention):
  """Multi-head sparse Sinkhorn self-attention as in LRA (Tay et al., 2020); non-causal.

  Fields: :class:`base.Attention`'s ``num_heads`` (H), ``qkv_dim`` (D, over all heads),
  ``out_dim`` (O), ``use_bias`` and ``dense_init`` (of the ``query``, ``key``, ``value`` and
  ``out`` projections; ``use_bias`` also on ``sort_net``), then ``dropout_rate``, ``dtype``
  and its own options:

  Attributes:
    dropout_rate: dropout on the local and the sorted attention weights.
    block_size: b, the size of each strided group (LRA: 50).
    max_num_blocks: M, outputs of the sorting network (LRA: 25); groups ``l >= M`` are
      no sort target. 0: ``ceil(max_length / block_size)``, every group of the longest
      input.
    max_length: the longest input, used only when ``max_num_blocks == 0``.
    sort: ``"softmax"`` (LRA's row softmax, default) or ``"sinkhorn"`` (the paper's
      balancing; needs ``M >= N``).
    sinkhorn_iters: Sinkhorn normalisation rounds (>= 1), ``sort="sinkhorn"`` only.
    temperature: the sorting logits are divided by it (> 0; LRA: 1.0).
    joint_softmax: one softmax over the 2b local and sorted keys; False (default, LRA):
      two separately normalised softmaxes whose outputs are added.
    lra_bugs: reproduce LRA's ``sinkhorn_attention.py`` (config field
      ``model.attention_kwargs.lra_bugs``): every sorted group is the sum of all groups
      (the einsum that sums keys and permutation separately; the sort network has no
      effect), and the padding mask is read as contiguous blocks of b though the groups
      are strided, masking queries and keys; see the module docstring. False (default):
      the sorting as in the paper and each query sees the real keys of its group.
    dtype: computation dtype; the sorting and the softmaxes are float32.

  Parameters besides ``query``/``key``/``value``/``out``: ``sort_net`` (a ``Dense``
  from the head width K to M, Xavier-uniform, shared by the heads, as LRA's
  ``DenseGeneral_0``).

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``. The soft
  permutation is sown into ``"intermediates"`` as ``permutation_BxHxNxM``.

  Raises:
    ValueError: if ``block_size``, ``max_num_blocks``, ``sinkhorn_iters``,
      ``temperature`` or ``sort`` is out of range, if ``sort="sinkhorn"`` has fewer
      sort outputs than groups, or (``max_num_blocks == 0``) the input is longer than
      ``max_length`` (each naming its ``model.attention_kwargs`` field).
  """

  block_size: int = 50
  max_num_blocks: int = 25
  max_length: int = 2048
  sort: str = "softmax"
  sinkhorn_iters: int = 5
  temperature: float = 1.0
  joint_softmax: bool = False
  lra_bugs: bool = False

  def _sort_width(self, length: int, num_groups: int) -> int:
    """M, after checking the fields against an input of ``length`` (N groups)."""
    if self.block_size < 1:
      raise ValueError(f"model.attention_kwargs.block_size={self.block_size} must be >= 1 "
                       "for sinkhorn")
    if self.max_num_blocks < 0:
      raise ValueError(f"model.attention_kwargs.max_num_blocks={self.max_num_blocks} must "
                       "be >= 0 for sinkhorn (0: ceil(max_length / block_size))")
    if self.sort not in SORTS:
      raise ValueError(f"model.attention_kwargs.sort={self.sort!r}; expected one of "
                       f"{list(SORTS)}")
    if self.sinkhorn_iters < 1:
      raise ValueError(f"model.attention_kwargs.sinkhorn_iters={self.sinkhorn_iters} must be "
                       ">= 1 for sinkhorn")
    if not self.temperature > 0:
      raise ValueError(f"model.attention_kwargs.temperature={self.temperature} must be > 0 "
                       "for sinkhorn")
    width = self.max_num_blocks
    if width == 0:
      base.check_max_length("sinkhorn", length, self.max_length)
      width = -(-self.max_length // self.block_size)
    if self.sort == "sinkhorn" and width < num_groups:
      raise ValueError(f"model.attention_kwargs.max_num_blocks={self.max_num_blocks} gives "
                       f"{width} sort targets for {num_groups} groups; sort='sinkhorn' needs "
                       "at least one per group (raise it, or 0: ceil(max_length / "
                       "block_size))")
    return width

  @nn.compact
  def __call__(self, x_BxLxE, mask_BxL=None, *, deterministic: bool = True):
    batch, length = x_BxLxE.shape[:2]
    b = self.block_size
    n = -(-length // max(b, 1))
    width = self._sort_width(length, n)
    m = min(n, width)                          # M', the sort targets used
    mask_BxL = base.default_mask(x_BxLxE, mask_BxL)
    q, k, v = self.project_qkv(x_BxLxE)
    heads, head_dim = q.shape[-2:]

    # Pad to N * b (appended positions are pads) and reshape to strided groups:
    # position p = s * N + g sits at [:, s, g].
    extra = n * b - length
    mask_BxP = jnp.pad(mask_BxL, ((0, 0), (0, extra)))
    real_BxSxN = mask_BxP.reshape(batch, b, n)

    def groups(t_BxLxHxK, zero_pads):
      t_BxLxHxK = jnp.pad(t_BxLxHxK, ((0, 0), (0, extra), (0, 0), (0, 0)))
      t_BxSxNxHxK = t_BxLxHxK.reshape(batch, b, n, heads, head_dim)
      if zero_pads:
        t_BxSxNxHxK = jnp.where(real_BxSxN[..., None, None], t_BxSxNxHxK, 0.0)
      return t_BxSxNxHxK

    correct = not self.lra_bugs
    q_BxSxNxHxK = groups(q / jnp.sqrt(head_dim).astype(self.dtype), False)
    k_BxSxNxHxK, v_BxSxNxHxK = groups(k, correct), groups(v, correct)

    # Sorting network on the sum of each group's keys.
    summary_BxNxHxK = jnp.sum(k_BxSxNxHxK.astype(jnp.float32), axis=1)
    sort_BxNxHxW = nn.Dense(width, use_bias=self.use_bias, kernel_init=base.KERNEL_INIT,
                            bias_init=base.BIAS_INIT, dtype=jnp.float32,
                            name="sort_net")(summary_BxNxHxK)
    logits_BxHxNxM = jnp.transpose(sort_BxNxHxW[..., :m], (0, 2, 1, 3)) / self.temperature
    valid_BxN = jnp.any(real_BxSxN, axis=1) if correct else jnp.ones((batch, n), bool)
    if self.sort == "sinkhorn":
      p_BxHxNxM = jnp.exp(log_sinkhorn(logits_BxHxNxM, valid_BxN[:, None, :],
                                       self.sinkhorn_iters))
    else:
      p_BxHxNxM = jax.nn.softmax(
          jnp.where(valid_BxN[:, None, None, :m], logits_BxHxNxM, NEG), axis=-1)
    self.sow("intermediates", "permutation_BxHxNxM", p_BxHxNxM)

    if correct:
      p_cast = p_BxHxNxM.astype(self.dtype)
      sk_BxSxNxHxK = jnp.einsum("bhnl,bslhk->bsnhk", p_cast, k_BxSxNxHxK[:, :, :m])
      sv_BxSxNxHxK = jnp.einsum("bhnl,bslhk->bsnhk", p_cast, v_BxSxNxHxK[:, :, :m])
      # Key t of group n real; sorted key t real where a weighted group has slot t real.
      local_keep = real_BxSxN.transpose(0, 2, 1)[:, None, :, None, :]
      sorted_keep = (jnp.einsum("bhnl,bsl->bhns", p_BxHxNxM,
                                real_BxSxN[:, :, :m].astype(jnp.float32)) > 0)[..., None, :]
    else:
      # LRA: keys summed over the groups and the permutation over l, separately.
      p_sum_BxNxH = jnp.sum(p_BxHxNxM, axis=-1).transpose(0, 2, 1)[:, None, :, :, None]
      sk_BxSxNxHxK = (jnp.sum(k_BxSxNxHxK, axis=2, keepdims=True) * p_sum_BxNxH
                      ).astype(self.dtype)
      sv_BxSxNxHxK = (jnp.sum(v_BxSxNxHxK, axis=2, keepdims=True) * p_sum_BxNxH
                      ).astype(self.dtype)
      # LRA: the mask cut into contiguous blocks [B, N, b], query AND key.
      real_BxNxS = mask_BxP.reshape(batch, n, b)
      allowed_BxNxSxS = real_BxNxS[:, :, :, None] & real_BxNxS[:, :, None, :]
      local_keep = allowed_BxNxSxS[:, None]
      sorted_keep = jnp.any(allowed_BxNxSxS, axis=1)[:, None, None]

    local_BxHxNxSxS = jnp.einsum("bsnhk,btnhk->bhnst", q_BxSxNxHxK, k_BxSxNxHxK)
    sorted_BxHxNxSxS = jnp.einsum("bsnhk,btnhk->bhnst", q_BxSxNxHxK, sk_BxSxNxHxK)
    local_BxHxNxSxS = jnp.where(local_keep, local_BxHxNxSxS.astype(jnp.float32), NEG)
    sorted_BxHxNxSxS = jnp.where(sorted_keep, sorted_BxHxNxSxS.astype(jnp.float32), NEG)
    dropout = nn.Dropout(self.dropout_rate)
    if self.joint_softmax:
      w_BxHxNxSx2S = jax.nn.softmax(
          jnp.concatenate([local_BxHxNxSxS, sorted_BxHxNxSxS], axis=-1), axis=-1)
      w_BxHxNxSx2S = dropout(w_BxHxNxSx2S.astype(self.dtype), deterministic=deterministic)
      w_local, w_sorted = w_BxHxNxSx2S[..., :b], w_BxHxNxSx2S[..., b:]
    else:
      w_local, w_sorted = (
          dropout(jax.nn.softmax(t, axis=-1).astype(self.dtype), deterministic=deterministic)
          for t in (local_BxHxNxSxS, sorted_BxHxNxSxS))
    y_BxSxNxHxK = (jnp.einsum("bhnst,btnhk->bsnhk", w_local, v_BxSxNxHxK)
                   + jnp.einsum("bhnst,btnhk->bsnhk", w_sorted, sv_BxSxNxHxK))
    y_BxLxHxK = y_BxSxNxHxK.reshape(batch, n * b, heads, head_dim)[:, :length]
    return self.project_out(y_BxLxHxK)


registry.register(registry.AttentionSpec(
    "sinkhorn", SinkhornAttention, paper="Tay et al., Sparse Sinkhorn Attention (2020)"))
