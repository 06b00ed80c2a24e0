"""Reformer LSH attention (Kitaev et al., ICLR 2020) as LRA builds it: shared QK, hashed, chunked.

LRA's ``models/reformer/reformer_attention.py``. Per head and hash round, over the n real
tokens: keys are the queries (LRA's ``length_norm=False``; ``normalize_keys`` for the
paper's); angular LSH ``argmax([x R; -x R])`` with one fixed rotation
(:func:`random_rotations`), pads bucketed last; tokens sorted by (bucket, position) and cut
into ``num_buckets`` chunks of ``ceil(n / num_buckets)``; each query attends to its chunk and
the previous one (wrapping, as LRA), across buckets unless ``attend_across_buckets=False``,
to itself only when it has no other key. Rounds combine by the softmax of their logsumexps
(the paper); each round is chunked on its own (docs/lra_parity.md). Heads are concatenated
with no output projection, so ``out_dim == qkv_dim``. Real outputs do not depend on padding;
pad rows are 0. Logits ``[B, H, R, N, c, 2c]``: ``O(L^2 / N)`` per head. Non-causal.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from simpletron_jax.model.attention import base, registry

NEG = -1e30          # masked keys (pads, other buckets, outside the two chunks)
SELF_LOGIT = -1e5    # the query's own key: used only when there is no other key
LRA_PAD_MULTIPLE = 10  # LRA's ``chunk_len`` default: the length is padded by 10 - L % 10


def random_rotations(hash_seed: int, head_dim: int, num_hashes: int,
                     num_buckets: int) -> jnp.ndarray:
  """The angular-LSH rotation, float32 ``N(0, 1)`` ``[K, R, num_buckets // 2]``, a constant.

  The same for every head, layer, call and length: LRA's ``hash_vectors`` draw from
  ``fold_in(PRNGKey(hash_seed), 1)`` with non-partitionable threefry, so LRA's values.

  Raises:
    ValueError: ``num_buckets`` not positive and even, or ``num_hashes < 1``, naming the field.
  """
  if num_buckets < 2 or num_buckets % 2:
    raise ValueError(f"model.attention_kwargs.num_buckets={num_buckets} must be a positive "
                     "even number (angular LSH uses [xR, -xR])")
  if num_hashes < 1:
    raise ValueError(f"model.attention_kwargs.num_hashes={num_hashes} must be >= 1")
  with jax.ensure_compile_time_eval(), jax.threefry_partitionable(False):
    key = jax.random.fold_in(jax.random.PRNGKey(hash_seed), 1)
    return jax.random.normal(key, (head_dim, num_hashes, num_buckets // 2), jnp.float32)


def lsh_buckets(x_BxLxHxK: jnp.ndarray, mask_BxL: jnp.ndarray,
                rotations_KxRxN: jnp.ndarray) -> jnp.ndarray:
  """Angular LSH buckets, int32 ``[B, H, R, L]``: ``[0, 2N)`` for real tokens, ``2N`` for pads.

  ``rotations_KxRxN`` (``N = num_buckets // 2``) is shared by the heads; a zero vector gets 0.
  """
  num_buckets = 2 * rotations_KxRxN.shape[-1]
  rotated_BxHxRxLxN = jnp.einsum("blhk,krn->bhrln", x_BxLxHxK.astype(jnp.float32),
                                 rotations_KxRxN)
  both = jnp.concatenate([rotated_BxHxRxLxN, -rotated_BxHxRxLxN], axis=-1)
  buckets_BxHxRxL = jnp.argmax(both, axis=-1).astype(jnp.int32)
  return jnp.where(mask_BxL[:, None, None, :], buckets_BxHxRxL, num_buckets)


class ReformerAttention(base.Attention):
  """LSH self-attention as LRA's Reformer (:class:`base.Attention`'s fields, then its own).

  ``qkv_dim`` must equal ``out_dim`` (``model.emb_dim``). Parameters: ``query`` and ``value``
  ``[E, H, K]`` (Xavier-uniform, LRA's ``ReformerBlock``); no ``key``, no ``out``.

  Attributes:
    dropout_rate: dropout on the chunk weights (none with ``lra_bugs``).
    num_hashes: R, hash rounds (LRA: 1).
    num_buckets: buckets, and chunks, per round; even (LRA: 10).
    hash_seed: seed of the fixed rotation (LRA: 0).
    normalize_keys: keys ``q / sqrt(mean(q^2) + 1e-6)`` (the paper, trax; LRA: False).
    attend_across_buckets: False: only keys of the query's own bucket (the paper's text).
    lra_bugs: LRA's ``10 - L % 10`` appended zero rows and an unread mask, no self-mask,
      logits times ``sqrt(K)``, no dropout, heads and positions scrambled by a reshape.

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxD`` in ``dtype``;
  hashing, logits and softmax in float32. Sows ``intermediates/buckets_BxHxRxL``.

  Raises:
    ValueError: bad ``num_buckets``, ``num_hashes`` or ``qkv_dim``, or ``qkv_dim != out_dim``.
  """

  num_hashes: int = 1
  num_buckets: int = 10
  hash_seed: int = 0
  normalize_keys: bool = False
  attend_across_buckets: bool = True
  lra_bugs: bool = False

  @nn.compact
  def __call__(self, x_BxLxE, mask_BxL=None, *, deterministic: bool = True):
    if self.qkv_dim != self.out_dim:
      raise ValueError(
          f"reformer has no output projection (LRA's structure), so model.qkv_dim "
          f"({self.qkv_dim}) must equal model.emb_dim ({self.out_dim})")
    head_dim = base.check_head_dims(self.qkv_dim, self.num_heads)
    rotations_KxRxN = random_rotations(self.hash_seed, head_dim, self.num_hashes,
                                       self.num_buckets)
    batch, length = x_BxLxE.shape[:2]
    if self.lra_bugs:   # zero rows appended; the mask is never read
      extra = LRA_PAD_MULTIPLE - length % LRA_PAD_MULTIPLE
      x_BxPxE = jnp.pad(x_BxLxE, ((0, 0), (0, extra), (0, 0)))
      mask_BxP = jnp.ones(x_BxPxE.shape[:2], bool)
    else:
      x_BxPxE, mask_BxP = x_BxLxE, base.default_mask(x_BxLxE, mask_BxL)
    padded = x_BxPxE.shape[1]
    h, r, nb = self.num_heads, self.num_hashes, self.num_buckets
    q_BxPxHxK, v_BxPxHxK = (self.project_heads(x_BxPxE, name)
                            for name in ("query", "value"))
    buckets_BxHxRxP = lsh_buckets(q_BxPxHxK, mask_BxP, rotations_KxRxN)
    self.sow("intermediates", "buckets_BxHxRxL", buckets_BxHxRxP)
    # Sorted slot p holds token order[p]; the n real tokens fill slots 0..n-1.
    order_BxHxRxP = jnp.argsort(buckets_BxHxRxP, axis=-1, stable=True)

    # c = ceil(n / nb) tokens a chunk, m = ceil(n / c) chunks; static bounds N and C.
    n_chunks, c_max = min(nb, padded), -(-padded // nb)
    n_B = jnp.sum(mask_BxP, axis=-1).astype(jnp.int32)
    c_B = jnp.maximum(-(-n_B // nb), 1)
    m_B = jnp.maximum(-(-n_B // c_B), 1)
    j_N, s_C = jnp.arange(n_chunks), jnp.arange(c_max)

    def slots(chunk_BxN):  # -> (slot [B, N, C] clipped to [0, P), valid [B, N, C])
      slot_BxNxC = chunk_BxN[:, :, None] * c_B[:, None, None] + s_C
      valid_BxNxC = (s_C < c_B[:, None, None]) & (slot_BxNxC < n_B[:, None, None])
      return jnp.clip(slot_BxNxC, 0, padded - 1), valid_BxNxC

    q_slot_BxNxC, q_valid_BxNxC = slots(jnp.broadcast_to(j_N, (batch, n_chunks)))
    prev_BxN = (j_N[None, :] - 1) % m_B[:, None]           # wraps: 0 looks at m - 1
    p_slot_BxNxC, p_valid_BxNxC = slots(prev_BxN)
    # One chunk (n = 1): its previous is itself; drop the copy (the softmax is the same, and
    # a doubled self logit of -1e5 would lose float32 precision).
    p_valid_BxNxC = p_valid_BxNxC & (m_B > 1)[:, None, None]
    k_slot_BxNx2C = jnp.concatenate([q_slot_BxNxC, p_slot_BxNxC], axis=-1)
    k_valid_BxNx2C = jnp.concatenate([q_valid_BxNxC, p_valid_BxNxC], axis=-1)

    def positions(slot_BxNxS):  # sorted slots -> token positions, [B, H, R, N, S]
      flat_BxHxRxNS = jnp.broadcast_to(slot_BxNxS.reshape(batch, 1, 1, -1),
                                       (batch, h, r, slot_BxNxS[0].size))
      pos = jnp.take_along_axis(order_BxHxRxP, flat_BxHxRxNS, axis=-1)
      return pos.reshape(batch, h, r, *slot_BxNxS.shape[1:])

    q_pos_BxHxRxNxC = positions(q_slot_BxNxC)
    k_pos_BxHxRxNx2C = positions(k_slot_BxNx2C)

    def gather(t_BxPxHxK, pos_BxHxRxNxS):  # -> [B, H, R, N, S, K]
      t_BxHxPxK = jnp.transpose(t_BxPxHxK, (0, 2, 1, 3))
      flat = pos_BxHxRxNxS.reshape(batch, h, -1, 1)
      out = jnp.take_along_axis(t_BxHxPxK, flat, axis=2)
      return out.reshape(*pos_BxHxRxNxS.shape, -1)

    qf_BxPxHxK = q_BxPxHxK.astype(jnp.float32)
    kf_BxPxHxK = qf_BxPxHxK
    if self.normalize_keys:
      kf_BxPxHxK = qf_BxPxHxK * jax.lax.rsqrt(
          jnp.mean(jnp.square(qf_BxPxHxK), axis=-1, keepdims=True) + 1e-6)
    scale = float(head_dim) ** 0.5 if self.lra_bugs else float(head_dim) ** -0.5
    q_BxHxRxNxCxK = gather(qf_BxPxHxK, q_pos_BxHxRxNxC)
    k_BxHxRxNx2CxK = gather(kf_BxPxHxK, k_pos_BxHxRxNx2C)
    v_BxHxRxNx2CxK = gather(v_BxPxHxK, k_pos_BxHxRxNx2C)
    logits_BxHxRxNxCx2C = scale * jnp.einsum("bhrnik,bhrnjk->bhrnij", q_BxHxRxNxCxK,
                                             k_BxHxRxNx2CxK)
    if not self.lra_bugs:
      own_BxHxRxNxCx2C = k_pos_BxHxRxNx2C[..., None, :] == q_pos_BxHxRxNxC[..., :, None]
      logits_BxHxRxNxCx2C = jnp.where(own_BxHxRxNxCx2C, SELF_LOGIT, logits_BxHxRxNxCx2C)
    keep_BxHxRxNxCx2C = jnp.broadcast_to(k_valid_BxNx2C[:, None, None, :, None, :],
                                         logits_BxHxRxNxCx2C.shape)
    if not self.attend_across_buckets:
      bucket_of = lambda pos: jnp.take_along_axis(  # noqa: E731
          buckets_BxHxRxP, pos.reshape(batch, h, r, -1), axis=-1).reshape(pos.shape)
      keep_BxHxRxNxCx2C = keep_BxHxRxNxCx2C & (
          bucket_of(k_pos_BxHxRxNx2C)[..., None, :] == bucket_of(q_pos_BxHxRxNxC)[..., :, None])
    logits_BxHxRxNxCx2C = jnp.where(keep_BxHxRxNxCx2C, logits_BxHxRxNxCx2C, NEG)
    lse_BxHxRxNxC = jax.nn.logsumexp(logits_BxHxRxNxCx2C, axis=-1)
    weights_BxHxRxNxCx2C = jnp.exp(logits_BxHxRxNxCx2C - lse_BxHxRxNxC[..., None])
    weights_BxHxRxNxCx2C = weights_BxHxRxNxCx2C.astype(self.dtype)
    if not self.lra_bugs:
      weights_BxHxRxNxCx2C = nn.Dropout(self.dropout_rate)(weights_BxHxRxNxCx2C,
                                                          deterministic=deterministic)
    o_BxHxRxNxCxK = jnp.einsum("bhrnij,bhrnjk->bhrnik", weights_BxHxRxNxCx2C,
                               v_BxHxRxNx2CxK.astype(self.dtype))

    # Unsort: token t sits at sorted slot inv[t] = chunk * c + s, i.e. at [chunk, s].
    inv_BxHxRxP = jnp.argsort(order_BxHxRxP, axis=-1)
    c_Bx1x1x1 = c_B[:, None, None, None]
    at_BxHxRxP = jnp.clip(inv_BxHxRxP // c_Bx1x1x1, 0, n_chunks - 1) * c_max + jnp.minimum(
        inv_BxHxRxP % c_Bx1x1x1, c_max - 1)
    o_BxHxRxPxK = jnp.take_along_axis(o_BxHxRxNxCxK.reshape(batch, h, r, n_chunks * c_max, -1),
                                      at_BxHxRxP[..., None], axis=3)
    z_BxHxRxP = jnp.take_along_axis(lse_BxHxRxNxC.reshape(batch, h, r, -1), at_BxHxRxP, axis=3)
    round_w_BxHxRxP = jax.nn.softmax(z_BxHxRxP, axis=2).astype(self.dtype)
    y_BxHxPxK = jnp.sum(round_w_BxHxRxP[..., None] * o_BxHxRxPxK, axis=2)
    if self.lra_bugs:   # heads-first reshape without a transpose, then the first L rows
      return y_BxHxPxK.reshape(batch, padded, self.qkv_dim)[:, :length]
    y_BxLxD = jnp.transpose(y_BxHxPxK, (0, 2, 1, 3)).reshape(batch, length, self.qkv_dim)
    return jnp.where(mask_BxP[..., None], y_BxLxD, 0).astype(self.dtype)


# LRA's module takes qkv_features from the input width: configs set qkv_dim = emb_dim.
registry.register(registry.AttentionSpec(
    "reformer", ReformerAttention,
    paper="Kitaev et al., Reformer: The Efficient Transformer (2020)", output_projection=False))
