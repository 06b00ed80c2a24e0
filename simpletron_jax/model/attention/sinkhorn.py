"""Sparse Sinkhorn attention (Tay et al., ICML 2020) as LRA computes it: strided groups + sorting.

LRA's ``models/sinkhorn_transformer/sinkhorn_attention.py``. L is padded to ``N * b``
(``N = ceil(L / b)``) and reshaped ``[B, b, N, ...]``, group n the strided
``{p : p mod N = n}``. Per head: a ``sort_net`` Dense maps each group's key sum to
``M = max_num_blocks`` logits (sliced to ``M' = min(N, M)``); ``sort="softmax"`` (LRA's) takes a
row softmax over real groups, ``"sinkhorn"`` the paper's log-space balancing, giving ``P``
``[N, M']``; group n's sorted keys and values are ``sum_l P_nl K_l``, ``sum_l P_nl V_l``. Each
query attends to its group's b keys and to its b sorted keys by two softmaxes whose outputs
are added (LRA's; ``joint_softmax`` for one). Logits ``[B, H, N, b, b]`` twice: O(L b + N M').
Pads get zero weight and no group of pads is a sort target; real outputs depend on how far
the batch is padded (through N), as in LRA. ``lra_bugs``: docs/lra_parity.md. Non-causal.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from simpletron_jax.model.attention import base, registry

# A finite "minus infinity" keeps gradients finite; an all-masked row comes out uniform, as LRA's.
NEG = -1e30
SORTS = ("softmax", "sinkhorn")


def log_sinkhorn(log_alpha_XxNxN: jnp.ndarray, valid_XxN: jnp.ndarray,
                 num_iters: int) -> jnp.ndarray:
  """Masked log-space Sinkhorn normalisation: ``[..., N, N]`` float32, ``NEG`` off ``valid``.

  Each of ``num_iters`` rounds subtracts the logsumexp of every row, then every column, over
  entries whose row and column are ``valid_XxN``; ``exp`` tends to doubly stochastic.
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
  """Sparse Sinkhorn attention as in LRA (:class:`base.Attention`'s fields, then its own).

  ``use_bias`` also applies to ``sort_net`` (K -> M, Xavier-uniform, shared by heads: LRA's
  ``DenseGeneral_0``).

  Attributes:
    dropout_rate: dropout on the local and the sorted weights.
    block_size: b, the strided group size (LRA: 50).
    max_num_blocks: M, sort outputs (LRA: 25); 0: ``ceil(max_length / block_size)``.
    max_length: the longest input, used only when ``max_num_blocks == 0``.
    sort: ``"softmax"`` (LRA's, default) or ``"sinkhorn"`` (needs ``M >= N``; LRA never ran it).
    sinkhorn_iters: rounds for ``"sinkhorn"`` (>= 1).
    temperature: divides the sorting logits (> 0; LRA: 1.0).
    joint_softmax: one softmax over the 2b keys instead of two added ones.
    lra_bugs: LRA's sorting einsum (every sorted group the sum of all groups), its mask read
      as contiguous blocks though groups are strided, pads not zeroed.

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``; sorting and
  softmaxes in float32. Sows ``intermediates/permutation_BxHxNxM``.

  Raises:
    ValueError: a field out of range, too few sort outputs for ``"sinkhorn"``, or an input
      longer than ``max_length`` when needed, naming the ``model.attention_kwargs`` field.
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

    # Position p = s * N + g sits at [:, s, g].
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
