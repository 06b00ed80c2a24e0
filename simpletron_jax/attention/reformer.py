"""Reformer LSH attention: shared-QK attention within hash buckets, sorted and chunked.

Kitaev et al., "Reformer: The Efficient Transformer" (ICLR 2020, sec. 2); the LRA
"Reformer" baseline (``lra_benchmarks/models/reformer/reformer_attention.py``). Per head
and per hash round r = 1..R:

1. Shared QK: the keys are the queries, length-normalised:
   ``k_j = q_j / sqrt(mean(q_j^2) + 1e-6)`` (unit RMS, as trax and LRA's
   ``length_normalized``); logits are ``q_i . k_j / sqrt(d)``.
2. Angular LSH (paper sec. 2): ``h(x) = argmax([x R_r; -x R_r])`` with a random
   ``[K, num_buckets / 2]`` rotation ``R_r`` per head and round, drawn from
   ``jax.random.PRNGKey(hash_seed)`` (see :func:`random_rotations`; its shape does not
   depend on L). Pad tokens get bucket ``num_buckets``, after every real bucket.
3. Sort by (bucket, position) with a stable sort; cut the sorted sequence into chunks of
   ``chunk_length``. A query attends to the keys of its own chunk and of the previous
   chunk (no wrap-around) that are in its bucket and real. A token does not attend to
   itself unless it has no other key (the paper's rule; done as in trax by setting
   its own logit to -1e5, so the weight is exactly 0 when there is another key).
4. Rounds are combined with the paper's weights: with ``z_r(i)`` the logsumexp of
   query i's logits in round r, ``o_i = sum_r softmax_r(z_r(i)) o_r(i)``.

Rounds are sorted and chunked separately (trax concatenates them into one sequence),
so real tokens' sorted positions and chunks never depend on the amount of padding.
Memory: the chunk logits are ``[B, H, R, L/c, c, 2c]``, O(R L c); no ``L x L`` array.

LRA defaults taken: ``num_hashes = 1``, ``num_buckets = 10`` (``ReformerAttention``
defaults, the ones its encoder uses). LRA splits the sorted sequence into
``num_hashes * num_buckets`` chunks, i.e. a chunk length of about L / 10 (about 200
for ListOps' 2001 tokens); here the chunk length is a fixed field (so that the chunks
do not depend on the padded length), default 200. LRA's code differs from the paper:
no padding mask, no self-mask, no bucket mask inside a chunk, no key normalisation,
logits multiplied (not divided) by ``sqrt(d)``, one rotation for every head and no
output projection. Those are not reproduced.

Causal form: none; the variant is used bidirectionally, as in LRA.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from simpletron_jax.attention import base

NEG = -1e30          # masked keys (pads, other buckets, out of the window)
SELF_LOGIT = -1e5    # the query's own key: used only when there is no other key


def random_rotations(hash_seed: int, num_heads: int, head_dim: int, num_hashes: int,
                     num_buckets: int) -> jnp.ndarray:
  """The angular-LSH rotations: ``N(0, 1)`` of shape ``[H, K, R, num_buckets // 2]``.

  Drawn from ``jax.random.PRNGKey(hash_seed)``: the same in every call and run with the
  same seed, and independent of the sequence length.

  Raises:
    ValueError: if ``num_buckets`` is not a positive even number (naming
      ``model.attention_kwargs.num_buckets``) or ``num_hashes < 1`` (naming
      ``model.attention_kwargs.num_hashes``).
  """
  if num_buckets < 2 or num_buckets % 2:
    raise ValueError(f"model.attention_kwargs.num_buckets={num_buckets} must be a positive "
                     "even number (angular LSH uses [xR, -xR])")
  if num_hashes < 1:
    raise ValueError(f"model.attention_kwargs.num_hashes={num_hashes} must be >= 1")
  return jax.random.normal(jax.random.PRNGKey(hash_seed),
                           (num_heads, head_dim, num_hashes, num_buckets // 2), jnp.float32)


def lsh_buckets(x_BxLxHxK: jnp.ndarray, mask_BxL: jnp.ndarray,
                rotations_HxKxRxN: jnp.ndarray) -> jnp.ndarray:
  """Angular LSH buckets (Kitaev et al., 2020, sec. 2).

  Args:
    x_BxLxHxK: the shared query/key vectors (float).
    mask_BxL: bool, True for real tokens.
    rotations_HxKxRxN: from :func:`random_rotations`, ``N = num_buckets // 2``.

  Returns:
    int32 ``[B, H, R, L]`` buckets in ``[0, 2N)`` for real tokens and ``2N`` (after
    every real bucket) for pads.
  """
  num_buckets = 2 * rotations_HxKxRxN.shape[-1]
  rotated_BxHxRxLxN = jnp.einsum("blhk,hkrn->bhrln", x_BxLxHxK.astype(jnp.float32),
                                 rotations_HxKxRxN)
  both = jnp.concatenate([rotated_BxHxRxLxN, -rotated_BxHxRxLxN], axis=-1)
  buckets_BxHxRxL = jnp.argmax(both, axis=-1).astype(jnp.int32)
  return jnp.where(mask_BxL[:, None, None, :], buckets_BxHxRxL, num_buckets)


class ReformerAttention(nn.Module):
  """Multi-head LSH self-attention (Kitaev et al., 2020); non-causal.

  Attributes:
    num_heads: H.
    qkv_dim: D, total width of queries/keys and values over all heads.
    out_dim: O, width of the output projection.
    dropout_rate: dropout on the chunk attention weights.
    num_hashes: R, hash rounds (LRA: 1).
    num_buckets: buckets per round, even (LRA: 10).
    chunk_length: c, tokens per chunk of the sorted sequence.
    hash_seed: seed of the fixed random rotations.
    dtype: computation dtype; hashing, logits and softmax are float32.
    use_bias: biases on the query, key, value and output projections (config field
      ``model.attention_bias``; LRA's attentions have none, see :func:`base.head_projection`).

  Parameters: ``query``, ``value``, ``out`` (shared QK: there is no ``key``).

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``. The
  buckets are sown into ``"intermediates"`` as ``buckets_BxHxRxL``.

  Raises:
    ValueError: for an odd or non-positive ``num_buckets``, ``num_hashes < 1`` or
      ``chunk_length < 1`` (each naming its ``model.attention_kwargs`` field), or
      ``qkv_dim`` not a multiple of ``num_heads``.
  """

  num_heads: int
  qkv_dim: int
  out_dim: int
  dropout_rate: float = 0.0
  num_hashes: int = 1
  num_buckets: int = 10
  chunk_length: int = 200
  hash_seed: int = 0
  dtype: base.Dtype = jnp.float32
  use_bias: bool = True

  @nn.compact
  def __call__(self, x_BxLxE, mask_BxL=None, *, deterministic: bool = True):
    if self.chunk_length < 1:
      raise ValueError(f"model.attention_kwargs.chunk_length={self.chunk_length} must be >= 1 "
                       "for reformer")
    batch, length = x_BxLxE.shape[:2]
    mask_BxL = base.default_mask(x_BxLxE, mask_BxL)
    head_dim = base.check_head_dims(self.qkv_dim, self.num_heads)
    q_BxLxHxK, v_BxLxHxK = (base.head_projection(x_BxLxE, self.num_heads, self.qkv_dim,
                                                 self.dtype, name, use_bias=self.use_bias)
                            for name in ("query", "value"))
    rotations = random_rotations(self.hash_seed, self.num_heads, head_dim, self.num_hashes,
                                 self.num_buckets)
    buckets_BxHxRxL = lsh_buckets(q_BxLxHxK, mask_BxL, rotations)
    self.sow("intermediates", "buckets_BxHxRxL", buckets_BxHxRxL)

    # Sort each (example, head, round) by (bucket, position); pad to whole chunks.
    order_BxHxRxL = jnp.argsort(buckets_BxHxRxL, axis=-1, stable=True)
    c = self.chunk_length
    n_chunks = -(-length // c)
    extra = n_chunks * c - length
    pad = ((0, 0), (0, 0), (0, 0), (0, extra))
    order_BxHxRxP = jnp.pad(order_BxHxRxL, pad)                     # P = n_chunks * c
    slot_real_BxHxRxP = jnp.pad(jnp.ones_like(order_BxHxRxL, bool), pad)
    s_bucket_BxHxRxP = jnp.take_along_axis(buckets_BxHxRxL, order_BxHxRxP, axis=-1)
    s_real_BxHxRxP = slot_real_BxHxRxP & jnp.take_along_axis(
        jnp.broadcast_to(mask_BxL[:, None, None, :], buckets_BxHxRxL.shape), order_BxHxRxP,
        axis=-1)

    qf = q_BxLxHxK.astype(jnp.float32)
    kf = qf * jax.lax.rsqrt(jnp.mean(jnp.square(qf), axis=-1, keepdims=True) + 1e-6)
    qf = qf / jnp.sqrt(float(head_dim))

    def gather(t_BxLxHxK):  # -> [B, H, R, C, c, K] in sorted order
      t_BxHxLxK = jnp.transpose(t_BxLxHxK, (0, 2, 1, 3))
      idx = order_BxHxRxP[..., None]
      t_BxHxRxPxK = jnp.take_along_axis(t_BxHxLxK[:, :, None], idx, axis=3)
      return t_BxHxRxPxK.reshape(batch, self.num_heads, self.num_hashes, n_chunks, c, -1)

    def chunks(t_BxHxRxP):
      return t_BxHxRxP.reshape(batch, self.num_heads, self.num_hashes, n_chunks, c)

    def one_back(t, fill):  # chunk axis 3, slot axis 4: [.., C, c, ..] -> [.., C, 2c, ..]
      prev = jnp.concatenate([jnp.full_like(t[:, :, :, :1], fill), t[:, :, :, :-1]], axis=3)
      return jnp.concatenate([t, prev], axis=4)

    q_BxHxRxCxSxK = gather(qf)
    k_BxHxRxCx2SxK = one_back(gather(kf), 0.0)
    v_BxHxRxCx2SxK = one_back(gather(v_BxLxHxK), 0.0)
    q_pos = chunks(order_BxHxRxP)
    q_bucket = chunks(s_bucket_BxHxRxP)
    k_pos = one_back(q_pos, -1)
    k_bucket = one_back(q_bucket, -1)
    k_real = one_back(chunks(s_real_BxHxRxP), False)

    # C chunks of S = chunk_length slots; each sees 2S keys (its chunk and the previous).
    logits_BxHxRxCxSx2S = jnp.einsum("bhrcik,bhrcjk->bhrcij", q_BxHxRxCxSxK, k_BxHxRxCx2SxK)
    keep_BxHxRxCxSx2S = k_real[..., None, :] & (k_bucket[..., None, :] == q_bucket[..., :, None])
    self_BxHxRxCxSx2S = k_pos[..., None, :] == q_pos[..., :, None]
    logits_BxHxRxCxSx2S = jnp.where(
        keep_BxHxRxCxSx2S, jnp.where(self_BxHxRxCxSx2S, SELF_LOGIT, logits_BxHxRxCxSx2S), NEG)
    lse_BxHxRxCxS = jax.nn.logsumexp(logits_BxHxRxCxSx2S, axis=-1)
    weights_BxHxRxCxSx2S = jnp.exp(logits_BxHxRxCxSx2S - lse_BxHxRxCxS[..., None])
    weights_BxHxRxCxSx2S = nn.Dropout(self.dropout_rate)(
        weights_BxHxRxCxSx2S.astype(self.dtype), deterministic=deterministic)
    o_BxHxRxCxSxK = jnp.einsum("bhrcij,bhrcjk->bhrcik", weights_BxHxRxCxSx2S, v_BxHxRxCx2SxK)

    # Unsort: sorted slot p holds token order[p]; token t sits at slot inv[t].
    inv_BxHxRxL = jnp.argsort(order_BxHxRxL, axis=-1)
    o_BxHxRxPxK = o_BxHxRxCxSxK.reshape(batch, self.num_heads, self.num_hashes, n_chunks * c, -1)
    o_BxHxRxLxK = jnp.take_along_axis(o_BxHxRxPxK, inv_BxHxRxL[..., None], axis=3)
    z_BxHxRxL = jnp.take_along_axis(
        lse_BxHxRxCxS.reshape(batch, self.num_heads, self.num_hashes, -1), inv_BxHxRxL, axis=3)
    round_w_BxHxRxL = jax.nn.softmax(z_BxHxRxL, axis=2).astype(self.dtype)
    y_BxHxLxK = jnp.sum(round_w_BxHxRxL[..., None] * o_BxHxRxLxK, axis=2)
    y_BxLxHxK = jnp.transpose(y_BxHxLxK, (0, 2, 1, 3))
    return base.output_projection(y_BxLxHxK, self.out_dim, self.dtype, use_bias=self.use_bias)
