"""BigBird attention (Zaheer et al., 2020), the blocked ITC form, as LRA computes it.

LRA's ``models/bigbird/bigbird_attention.py`` (block 64, 3 random blocks, the layer index as
``connectivity_seed`` in ``bigbird.py``). The pattern is laid out on ``P`` tokens (field
``max_length``, else the batch length), extended by ``b - P % b`` to ``N = P // b + 1`` blocks.
Blocks 0 and N-1 are global; every other block n attends to ``{0, n-1, n, n+1, N-1}`` and
its random blocks, drawn as LRA's ``get_block_rand_mask`` (:func:`lra_random_blocks`) with the
layer read from the module path (:func:`layer_index`). Only real keys get weight; with
``max_length`` set only the blocks holding the batch are computed, so padding changes
nothing. Scores ``[B, H, N, b, (5 + r) b]`` plus ``[B, H, b, L]`` per global block: linear in
L. Non-causal.
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
  """The layer i of the innermost ``encoderblock_{i}`` in ``path`` (LRA's names), else 0."""
  for name in reversed(tuple(path)):
    match = re.fullmatch(r"encoderblock_(\d+)", name)
    if match:
      return int(match.group(1))
  return 0


def num_pattern_blocks(length: int, block_size: int) -> int:
  """N, ``length // block_size + 1``: LRA pads by ``b - length % b``."""
  return length // block_size + 1


def _candidates(i: int, num_blocks: int, last: int) -> np.ndarray:
  """The blocks query block i may draw, as LRA's ``get_block_rand_mask`` lists them."""
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
  """LRA's random key blocks of one layer, ``[H, N, r]`` int64, read-only; ``-1`` where none.

  ``numpy.random.RandomState(seed)`` (``seed = random_seed + layer``), then per head and query
  block 1..N-2 the first r of a permutation of :func:`_candidates`; draws stop at
  ``min(N b, 1024)`` tokens as in LRA. Rows 0 and N-1, and draws past the candidates (where
  LRA raises), are -1.
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
  """``[H, N, 5 + r]`` int64 key blocks of each (head, query block), read-only; ``-1`` empty.

  ``[0, n-1, n, n+1, N-1]`` then the random blocks, repeats dropped; global rows list only
  themselves.
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
  """BigBird block-sparse attention as in LRA (:class:`base.Attention`'s fields, then its own).

  Attributes:
    dropout_rate: dropout on the weights (none with ``lra_bugs``).
    block_size: b (LRA: 64).
    num_random_blocks: r (LRA: 3; 0: none).
    random_seed: added to the layer index to seed the draw (0: LRA's).
    max_length: P (configs: ``model.max_length`` plus CLS); 0: the batch's length, as LRA.
    lra_bugs: LRA's appended positions as real keys, zero outputs at pad queries, no
      attention dropout.

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``; softmax in float32.
  Sows ``intermediates/random_blocks`` ``[H, N, r]`` int32.

  Raises:
    ValueError: a negative field, ``block_size < 1``, or ``0 < max_length < L``, naming the
      ``model.attention_kwargs`` field; or bad ``qkv_dim``.
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
