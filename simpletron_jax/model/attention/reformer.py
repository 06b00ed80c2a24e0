"""Reformer LSH attention as LRA builds it: shared QK, hashed, sorted, cut into chunks.

Kitaev et al., "Reformer: The Efficient Transformer" (ICLR 2020, sec. 2), in the form of
the LRA "Reformer" baseline (``lra_benchmarks/models/reformer/reformer_attention.py``,
docs/lra_parity.md). Per head and per hash round r = 1..R, over the n real tokens of
an example:

1. Shared QK: the keys are the queries, ``k_j = q_j`` (LRA's ``length_norm=False``; the
   paper's unit-RMS keys with ``normalize_keys=True``); logits ``q_i . k_j / sqrt(K)``.
2. Angular LSH: ``h(x) = argmax([x R_r; -x R_r])`` with one ``N(0, 1)`` rotation
   ``[K, R, num_buckets / 2]`` for every head, layer and call, drawn from
   ``fold_in(PRNGKey(hash_seed), 1)`` (LRA's ``nn.stochastic(PRNGKey(0))`` +
   ``nn.make_rng()``; :func:`random_rotations`). Pads get bucket ``num_buckets``, after
   every real bucket.
3. Sort by (bucket, position) and cut the n sorted real tokens into chunks of
   ``c = ceil(n / num_buckets)`` (LRA cuts each round into ``num_buckets`` chunks, one
   average bucket each). A query attends to every key of its own chunk and of the previous
   chunk, the first chunk's previous being the last (LRA's ``look_one_back`` wraps around,
   as trax's ``look_adjacent``), across buckets (LRA has no bucket mask, trax's
   ``attend_across_buckets=True``; ``attend_across_buckets=False`` keeps the same bucket
   only). A token does not attend to itself unless it has no other key (the paper's rule,
   done as trax: its own logit is -1e5).
4. Rounds are combined with the paper's weights: with ``z_r(i)`` the logsumexp of query
   i's logits in round r, ``o_i = sum_r softmax_r(z_r(i)) o_r(i)``.
5. The heads are concatenated, ``[B, L, H*K]``; there is no output projection (LRA's
   structure), so ``out_dim`` must equal ``qkv_dim``.

Since the chunks are laid over the real tokens only, real outputs do not depend on the
amount of padding; pad rows return 0. Rounds are sorted and chunked separately (LRA
concatenates the rounds, so for R > 1 its first chunk of round r looks back into round
r - 1; LRA runs R = 1). Memory: logits ``[B, H, R, N, c, 2c]`` with N = num_buckets, i.e.
``O(L^2 / N)`` per head as in LRA; no ``L x L`` array.

``lra_bugs=True`` reproduces what LRA's code computes beyond those choices (docs/lra_parity.md): the input is padded with ``10 - L % 10`` zero rows (always 1..10, LRA's
``chunk_len=10``) and the padding mask is never read, so pads and appended rows are real
tokens and keys; chunks are cut over that padded length; no self-mask; logits multiplied
by ``sqrt(K)`` instead of divided; no attention dropout (LRA takes ``dropout_rate`` and
never uses it); the heads-first result ``[B, H, L', K]`` is reshaped to ``[B, L', H*K]``
without a transpose, which scrambles positions and heads, then cut to the first L rows.

Causal form: none; the variant is used bidirectionally, as in LRA.
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
  """The angular-LSH rotation, float32 ``N(0, 1)`` of shape ``[K, R, num_buckets // 2]``.

  The same for every head, layer and call, independent of the sequence length. Drawn as
  LRA's ``hash_vectors`` draws it: ``jax.random.normal`` on ``fold_in(PRNGKey(hash_seed), 1)``
  (the first ``nn.make_rng()`` inside ``nn.stochastic(PRNGKey(hash_seed))``), with the
  original, non-partitionable threefry bits, so the values are those of LRA's jax 0.4
  whatever the installed jax's default (``lra_benchmarks/models/reformer/
  reformer_attention.py``, ``hash_seed=0`` there). Computed at trace time (a constant).

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
  with jax.ensure_compile_time_eval(), jax.threefry_partitionable(False):
    key = jax.random.fold_in(jax.random.PRNGKey(hash_seed), 1)
    return jax.random.normal(key, (head_dim, num_hashes, num_buckets // 2), jnp.float32)


def lsh_buckets(x_BxLxHxK: jnp.ndarray, mask_BxL: jnp.ndarray,
                rotations_KxRxN: jnp.ndarray) -> jnp.ndarray:
  """Angular LSH buckets (Kitaev et al., 2020, sec. 2; LRA's ``hash_vectors``).

  Args:
    x_BxLxHxK: the shared query/key vectors (float).
    mask_BxL: bool, True for real tokens.
    rotations_KxRxN: from :func:`random_rotations`, ``N = num_buckets // 2``, shared by
      every head.

  Returns:
    int32 ``[B, H, R, L]`` buckets in ``[0, 2N)`` for real tokens and ``2N`` (after
    every real bucket) for pads. A zero vector gets bucket 0 (argmax of ties).
  """
  num_buckets = 2 * rotations_KxRxN.shape[-1]
  rotated_BxHxRxLxN = jnp.einsum("blhk,krn->bhrln", x_BxLxHxK.astype(jnp.float32),
                                 rotations_KxRxN)
  both = jnp.concatenate([rotated_BxHxRxLxN, -rotated_BxHxRxLxN], axis=-1)
  buckets_BxHxRxL = jnp.argmax(both, axis=-1).astype(jnp.int32)
  return jnp.where(mask_BxL[:, None, None, :], buckets_BxHxRxL, num_buckets)


class ReformerAttention(base.Attention):
  """Multi-head LSH self-attention as LRA's Reformer (Kitaev et al., 2020); non-causal.

  Fields: :class:`base.Attention`'s ``num_heads`` (H), ``qkv_dim`` (D, queries/keys and
  values over all heads; it must equal ``out_dim``: no output projection), ``out_dim`` (O,
  ``model.emb_dim``), ``use_bias`` and ``dense_init`` (of the ``query`` and ``value``
  projections), then ``dropout_rate``, ``dtype`` and its own options:

  Attributes:
    dropout_rate: dropout on the chunk attention weights (not applied with ``lra_bugs``).
    num_hashes: R, hash rounds (LRA: 1).
    num_buckets: buckets per round, even; also the number of chunks per round (LRA: 10).
    hash_seed: seed of the fixed rotation (LRA: 0).
    normalize_keys: keys ``q / sqrt(mean(q^2) + 1e-6)`` as in the paper and trax; LRA's
      ``length_norm`` is False (the default here).
    attend_across_buckets: a query sees every key of its two chunks (LRA, trax's default);
      False keeps only the keys of its own bucket (the paper's description).
    lra_bugs: compute what LRA's ``reformer_attention.py`` computes where it departs from
      the method: pad with ``10 - L % 10`` zero rows and ignore the padding mask (pads and
      appended rows are keys, and the chunks are cut over the padded length), no
      self-mask, logits times ``sqrt(K)`` instead of divided, no attention dropout, and the
      heads-first ``[B, H, L', K]`` result reshaped to ``[B, L', H*K]`` without a transpose
      (positions and heads scrambled). Config field ``model.attention_kwargs.lra_bugs``.
    dtype: computation dtype; hashing, logits and softmax are float32.

  Parameters: ``query`` and ``value`` kernels ``[E, H, K]`` (Xavier-uniform, as LRA's
  ``ReformerBlock``); shared QK: there is no ``key``; no ``out``.

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxD`` in ``dtype``.
  The buckets are sown into ``"intermediates"`` as ``buckets_BxHxRxL`` (L the padded
  length with ``lra_bugs``).

  Raises:
    ValueError: for an odd or non-positive ``num_buckets`` or ``num_hashes < 1`` (each
      naming its ``model.attention_kwargs`` field), ``qkv_dim`` not a multiple of
      ``num_heads``, or ``qkv_dim != out_dim`` (naming ``model.qkv_dim`` and
      ``model.emb_dim``).
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

    # Chunks over the n real tokens: length c = ceil(n / nb), m = ceil(n / c) of them.
    # Static bounds: N = min(nb, P) chunks of C = ceil(P / nb) slots.
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


# LRA's ``models/reformer/reformer_attention.py``: ``n_buckets=10`` chunks per round and no
# output projection are the module's defaults; its ``qkv_dim`` is ``emb_dim`` (set by
# ``configs/lra.make_config``): LRA's module takes ``qkv_features`` from the input width.
registry.register(registry.AttentionSpec(
    "reformer", ReformerAttention,
    paper="Kitaev et al., Reformer: The Efficient Transformer (2020)", output_projection=False))
