"""BigBird attention: block window + global first and last blocks + random blocks.

Zaheer et al., "Big Bird: Transformers for Longer Sequences" (2020), the blocked ITC form,
as LRA's code computes it (``models/bigbird/bigbird_attention.py``; block 64 and 3 random
blocks there, ``connectivity_seed`` = the layer index in ``models/bigbird/bigbird.py``).

Layout. The pattern is laid out on ``P`` tokens: the module field ``max_length`` when it is
set (the configs set it to ``model.max_length`` plus CLS, the length LRA pads every batch
to), else the batch's length L. As LRA does, ``P`` is extended by ``b - P % b`` positions (a
whole block when ``b`` divides ``P``) to ``N = P // b + 1`` blocks of ``b = block_size``
tokens. For query block n:

* n = 0 and n = N-1 are GLOBAL: their queries attend to every key, and every query attends
  to their keys;
* every other n attends to the blocks ``{0, n-1, n, n+1, N-1}`` (so block 1 sees
  ``{0, 1, 2, N-1}`` and block N-2 sees ``{0, N-3, N-2, N-1}``) and to its
  ``num_random_blocks`` random blocks.

Random blocks (:func:`lra_random_blocks`): LRA's ``get_block_rand_mask`` draw, made in numpy
at trace time from ``numpy.random.RandomState(random_seed + layer)``, head after head. The
layer index is read from the Flax module path (:func:`layer_index`): the encoder names block
i ``encoderblock_{i}`` (LRA's names too), so no per-layer argument has to travel through the
encoder and the registry; a module outside an encoder block is layer 0. The pattern is fixed
across steps and examples, differs between heads and layers, and depends only on ``N`` (LRA
restricts the draws to the first 1024 tokens, as the BigBird code it follows does).

Masking (default): only real keys get weight. With ``max_length`` set, the pattern does not
depend on the batch's padding, and only the blocks that hold the batch are computed (blocks
past the batch are padding and get no weight): outputs at real positions are padding
invariant. With ``max_length = 0`` the pattern follows the batch length, as in LRA's code.

``lra_bugs=True`` reproduces the rest of LRA's ``bigbird_attention.py``: the appended
positions (zero inputs, LRA pads the mask with ``-1e9`` on a bool array, i.e. True) are REAL
keys; the outputs at padding queries are zero (LRA multiplies the context by the query mask:
this matters under LRA's MEAN over the pads); and no attention dropout (LRA's sparse path
ignores ``dropout_rate``). Non-causal (LRA falls back to full attention for causal).

Cost: scores ``[B, H, N, b, (5 + r) b]`` plus ``[B, H, b, L]`` per global block: linear in L.
"""

from __future__ import annotations

import functools
import re
from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from simpletron_jax.model.attention import base, registry
from simpletron_jax.model.attention.local import check_int_field, masked_softmax, scale_queries

# LRA's sparse_dot_product_attention draws random blocks only up to this many tokens.
RANDOM_LAST_IDX = 1024


def layer_index(path: Sequence[str]) -> int:
  """The encoder layer of a module: i from the innermost ``encoderblock_{i}`` in ``path``.

  Args:
    path: the Flax module path (``module.path``).

  Returns:
    i, or 0 when no component is named ``encoderblock_<int>``.
  """
  for name in reversed(tuple(path)):
    match = re.fullmatch(r"encoderblock_(\d+)", name)
    if match:
      return int(match.group(1))
  return 0


def num_pattern_blocks(length: int, block_size: int) -> int:
  """N: LRA pads ``length`` by ``b - length % b`` (a whole block when b divides it).

  Returns:
    ``length // block_size + 1``.
  """
  return length // block_size + 1


def _candidates(i: int, num_blocks: int, last: int) -> np.ndarray:
  """The key blocks query block i (1..N-2) may draw at random, in LRA's order.

  LRA's ``get_block_rand_mask`` (``models/bigbird/bigbird_attention.py``): blocks 1..N-2
  without the window of i, cut at ``last``; its special rows (i = 1, 2, N-3, N-2, checked in
  that order) and numpy's slicing (negative bounds included) are kept, since the draw
  depends on the exact array.
  """
  a = np.arange(1, num_blocks - 1)
  if i == 1:
    return a[2:last]
  if i == 2:
    return a[3:last]
  if i == num_blocks - 3:
    return a[:last - 4]
  if i == num_blocks - 2:
    return a[:last - 3]
  start, end = i - 2, i
  if start > last:
    return a[:last]
  if end + 1 == last:
    return a[:start]
  return np.concatenate([a[:start], a[end + 1:last]])


@functools.lru_cache(maxsize=256)
def lra_random_blocks(num_blocks: int, block_size: int, num_heads: int,
                      num_random_blocks: int, seed: int) -> np.ndarray:
  """LRA's random key blocks of one layer (``get_block_rand_mask``, one call per head).

  Seeds ``numpy.random.RandomState(seed)`` (LRA: ``numpy.random.seed(connectivity_seed)``)
  and, for each head in turn and each query block i = 1..N-2, takes the first r entries of a
  random permutation of :func:`_candidates`. Random draws stop at ``last``: block
  ``min(N b, 1024) // b - 1`` when ``min(N b, 1024) > 2 b``, else ``N - 1``.

  Args:
    num_blocks: N (padded length / b).
    block_size: b.
    num_heads: H.
    num_random_blocks: r.
    seed: the numpy seed (``random_seed + layer``), ``0 <= seed < 2**32``.

  Returns:
    ``[H, N, r]`` int64, read-only; rows 0 and N-1 (global) and draws beyond the candidates
    (LRA raises there) are ``-1``.
  """
  rng = np.random.RandomState(seed)
  out = np.full((num_heads, num_blocks, num_random_blocks), -1, np.int64)
  last_idx = min(num_blocks * block_size, RANDOM_LAST_IDX)
  last = last_idx // block_size - 1 if last_idx > 2 * block_size else num_blocks - 1
  for h in range(num_heads):
    for i in range(1, num_blocks - 1):
      drawn = rng.permutation(_candidates(i, num_blocks, last))[:num_random_blocks]
      out[h, i, :len(drawn)] = drawn
  out.flags.writeable = False
  return out


@functools.lru_cache(maxsize=256)
def key_blocks(num_blocks: int, block_size: int, num_heads: int, num_random_blocks: int,
               seed: int) -> np.ndarray:
  """The key blocks each (head, query block) attends to, for the non-global query blocks.

  Query block n (``0 < n < N-1``) gets ``[0, n-1, n, n+1, N-1]`` then its random blocks
  (:func:`lra_random_blocks`); a block already listed is replaced by ``-1``, so each key
  counts once. Global rows (n = 0, N-1) list only themselves (they attend to every key
  elsewhere).

  Returns:
    ``[H, N, 5 + r]`` int64, read-only, ``-1`` for an empty slot.
  """
  n = np.arange(num_blocks)[:, None]
  fixed = np.concatenate([np.zeros_like(n), n - 1, n, n + 1, np.full_like(n, num_blocks - 1)],
                         axis=1)
  rand = lra_random_blocks(num_blocks, block_size, num_heads, num_random_blocks, seed)
  slots = np.concatenate([np.broadcast_to(fixed, (num_heads,) + fixed.shape), rand], axis=2)
  slots = np.where((slots >= 0) & (slots < num_blocks), slots, -1)
  for s in range(1, slots.shape[2]):   # drop repeats of an earlier slot
    repeat = (slots[:, :, s:s + 1] == slots[:, :, :s]).any(axis=2) & (slots[:, :, s] >= 0)
    slots[:, :, s] = np.where(repeat, -1, slots[:, :, s])
  for g in {0, num_blocks - 1}:
    slots[:, g] = -1
    slots[:, g, 0] = g
  slots.flags.writeable = False
  return slots


def global_blocks(num_blocks: int) -> tuple[int, ...]:
  """The global query/key blocks: ``(0, N-1)`` (``(0,)`` when N = 1)."""
  return tuple(sorted({0, num_blocks - 1}))


class BigBirdAttention(base.Attention):
  """Multi-head BigBird block-sparse attention (Zaheer et al., 2020), as in LRA.

  Fields: :class:`base.Attention`'s ``num_heads`` (H), ``qkv_dim`` (D, over all heads),
  ``out_dim`` (O), ``use_bias`` and ``dense_init`` (of the ``query``, ``key``, ``value`` and
  ``out`` projections), then ``dropout_rate``, ``dtype`` and its own options:

  Attributes:
    dropout_rate: dropout on the attention weights (none with ``lra_bugs``).
    block_size: b, tokens per block (LRA: 64).
    num_random_blocks: r, random key blocks per query block (LRA: 3; 0 disables them).
    random_seed: added to the layer index to seed numpy's draw (0: LRA's seed, the layer
      index; seeds s and s+1 give layer-shifted patterns).
    max_length: P, the length the pattern is laid out for (the configs: ``model.max_length``
      plus CLS); 0: the batch's length, as LRA's code. Inputs longer than a nonzero P raise.
    lra_bugs: reproduce LRA's ``models/bigbird/bigbird_attention.py``: appended positions
      are real keys, padding queries output zero, no attention dropout (see the module
      docstring). Config field ``model.attention_kwargs.lra_bugs``; default False.
    dtype: computation dtype; the softmax is computed in float32.

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``.
  Non-causal. The chosen random blocks are sown into ``"intermediates"`` as
  ``random_blocks`` (``[H, N, r]`` int32, ``-1`` for none).

  Raises:
    ValueError: if ``block_size < 1``, ``num_random_blocks < 0``, ``random_seed < 0``,
      ``max_length < 0`` or ``0 < max_length < L`` (naming
      ``model.attention_kwargs.<field>``), or ``qkv_dim`` is not a multiple of
      ``num_heads``.
  """

  block_size: int = 64
  num_random_blocks: int = 3
  random_seed: int = 0
  max_length: int = 0
  lra_bugs: bool = False

  @nn.compact
  def __call__(self, x_BxLxE, mask_BxL=None, *, deterministic: bool = True):
    check_int_field(self.block_size, "block_size", "bigbird")
    check_int_field(self.num_random_blocks, "num_random_blocks", "bigbird", minimum=0)
    check_int_field(self.random_seed, "random_seed", "bigbird", minimum=0)
    check_int_field(self.max_length, "max_length", "bigbird", minimum=0)
    batch, length = x_BxLxE.shape[:2]
    if self.max_length:
      base.check_max_length("bigbird", length, self.max_length)
    b = self.block_size
    pattern_length = self.max_length or length
    num_blocks = num_pattern_blocks(pattern_length, b)
    mask_BxL = base.default_mask(x_BxLxE, mask_BxL)
    if self.lra_bugs:
      # Every pattern block is computed; the appended positions are zero inputs, real keys.
      num_computed = num_blocks
      appended = num_blocks * b - pattern_length
      keys_BxC = jnp.concatenate(
          [mask_BxL, jnp.zeros((batch, pattern_length - length), bool),
           jnp.ones((batch, appended), bool)], axis=1)
    else:
      # Blocks past the batch hold only padding: they take no weight, so they are skipped.
      num_computed = -(-length // b)
      keys_BxC = jnp.pad(mask_BxL, ((0, 0), (0, num_computed * b - length)))
    computed = num_computed * b
    x_BxCxE = jnp.pad(x_BxLxE, ((0, 0), (0, computed - length), (0, 0)))
    q, k, v = self.project_qkv(x_BxCxE)
    q = scale_queries(q)
    heads, head_dim = q.shape[2:]
    seed = self.random_seed + layer_index(self.path)
    self.sow("intermediates", "random_blocks", jnp.asarray(
        lra_random_blocks(num_blocks, b, heads, self.num_random_blocks, seed), jnp.int32))

    # Static key-block table of the computed blocks; blocks past them are dropped.
    slots_HxNxS = key_blocks(num_blocks, b, heads, self.num_random_blocks, seed)
    slots_HxNxS = np.where(slots_HxNxS < num_computed, slots_HxNxS, -1)[:, :num_computed]
    valid_HxNxS = slots_HxNxS >= 0
    index_HxNxS = np.maximum(slots_HxNxS, 0)
    num_slots = slots_HxNxS.shape[2]
    head_Hx1x1 = np.arange(heads)[:, None, None]

    def blocks(t_BxCxHxK):   # -> [B, H, N, b, K]
      return t_BxCxHxK.reshape(batch, num_computed, b, heads, head_dim).transpose(0, 3, 1, 2, 4)

    q_BxHxNxbxK, k_BxHxNxbxK, v_BxHxNxbxK = blocks(q), blocks(k), blocks(v)

    def gather(t_BxHxNxbxK):   # -> [B, H, N, S b, K]
      got = t_BxHxNxbxK[:, head_Hx1x1, index_HxNxS]
      return got.reshape(batch, heads, num_computed, num_slots * b, head_dim)

    k_BxHxNxSbxK, v_BxHxNxSbxK = gather(k_BxHxNxbxK), gather(v_BxHxNxbxK)
    real_BxNxb = keys_BxC.reshape(batch, num_computed, b)
    keep_BxHxNxSb = (real_BxNxb[:, index_HxNxS] & valid_HxNxS[None, ..., None]).reshape(
        batch, heads, num_computed, num_slots * b)
    logits = jnp.einsum("bhnqd,bhnkd->bhnqk", q_BxHxNxbxK, k_BxHxNxSbxK)
    weights = masked_softmax(logits, keep_BxHxNxSb[:, :, :, None, :], self.dtype)
    dropout = nn.Dropout(0.0 if self.lra_bugs else self.dropout_rate)
    weights = dropout(weights, deterministic=deterministic)
    y_BxHxNxbxK = jnp.einsum("bhnqk,bhnkd->bhnqd", weights, v_BxHxNxSbxK)

    # Global query blocks: every key.
    for g in global_blocks(num_blocks):
      if g >= num_computed:
        continue
      rows_BxHxbxC = masked_softmax(
          jnp.einsum("bhqd,bkhd->bhqk", q_BxHxNxbxK[:, :, g], k),
          keys_BxC[:, None, None, :], self.dtype)
      rows_BxHxbxC = dropout(rows_BxHxbxC, deterministic=deterministic)
      y_BxHxNxbxK = y_BxHxNxbxK.at[:, :, g].set(
          jnp.einsum("bhqk,bkhd->bhqd", rows_BxHxbxC, v))

    y_BxLxHxK = y_BxHxNxbxK.transpose(0, 2, 3, 1, 4).reshape(
        batch, computed, heads, head_dim)[:, :length]
    if self.lra_bugs:
      y_BxLxHxK = jnp.where(mask_BxL[:, :, None, None], y_BxLxHxK, 0)
    return self.project_out(y_BxLxHxK)


registry.register(registry.AttentionSpec(
    "bigbird", BigBirdAttention, paper="Zaheer et al., Big Bird (2020)"))
