"""Length-grouped training order (``config.data.group_by_length``).

Batches of examples of similar length need less padding, so a step on them is cheaper
(attention and the MLP scale with the padded length). The grouping follows the
"bucket by length within a shuffled pool" scheme of Fairseq/Tensor2Tensor-style samplers:

1. each epoch is a fresh seeded permutation of the split (seed = ``(config.seed, epoch)``);
2. it is cut into pools of ``pool_batches`` batches; each pool is sorted by length, cut into
   batches, and the order of its full batches is shuffled (so the step-to-step lengths stay
   random, not a curriculum);
3. the epochs are concatenated into one endless stream, read ``batch_size`` indices at a
   time, as the ungrouped order does.

Each epoch is still a permutation of the split, and batch ``i`` is a pure function of
``(seed, i)``, so a resumed run reads the same batches. It is off by default because it
changes LRA's batches (uniformly random examples). Where the split size is not a multiple
of the batch, batches straddling an epoch boundary mix two pools.
"""

from __future__ import annotations

import functools
import sys

import numpy as np

from simpletron_jax.data.common import bucketed_length


def grouped_epoch_order(lengths: np.ndarray, seed: int, epoch: int, batch_size: int,
                        pool_batches: int) -> np.ndarray:
  """One epoch of the grouped order.

  Args:
    lengths: ``[N]`` example lengths in tokens.
    seed: the data seed (``config.seed``).
    epoch: epoch number, 0-based.
    batch_size: examples per batch.
    pool_batches: batches per sorted pool; 1 sorts within a batch only.

  Returns:
    ``[N]`` int64, a permutation of ``range(N)``.

  Raises:
    ValueError: for a non-positive ``batch_size`` or ``pool_batches``
      (config field ``data.group_pool_batches``).
  """
  if batch_size <= 0 or pool_batches <= 0:
    raise ValueError(f"batch_size={batch_size} and data.group_pool_batches={pool_batches} "
                     "must be positive")
  rng = np.random.default_rng([int(seed), int(epoch)])
  perm = rng.permutation(len(lengths))
  pool = batch_size * pool_batches
  pieces = []
  for start in range(0, len(perm), pool):
    chunk = perm[start:start + pool]
    chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
    n_full = len(chunk) // batch_size
    blocks = chunk[:n_full * batch_size].reshape(n_full, batch_size)
    pieces += [blocks[rng.permutation(n_full)].reshape(-1), chunk[n_full * batch_size:]]
  return np.concatenate(pieces).astype(np.int64)


class GroupedBatches:
  """The endless grouped stream as a sequence of index batches (a grain data source).

  ``batches[i]`` is the ``[batch_size]`` int64 array of example indices of batch ``i``:
  stream positions ``i * batch_size ... (i + 1) * batch_size - 1``, position ``j`` being
  example ``grouped_epoch_order(..., epoch=j // N)[j % N]``.
  """

  def __init__(self, lengths: np.ndarray, seed: int, batch_size: int, pool_batches: int):
    self._lengths = np.asarray(lengths)
    self._seed, self._batch, self._pool = int(seed), int(batch_size), int(pool_batches)
    self._order = functools.lru_cache(maxsize=2)(self._epoch_order)

  def _epoch_order(self, epoch: int) -> np.ndarray:
    return grouped_epoch_order(self._lengths, self._seed, epoch, self._batch, self._pool)

  def __len__(self) -> int:
    return sys.maxsize // self._batch

  def __getitem__(self, i: int) -> np.ndarray:
    n = len(self._lengths)
    positions = np.arange(int(i) * self._batch, (int(i) + 1) * self._batch)
    epochs, offsets = positions // n, positions % n
    return np.array([self._order(int(e))[k] for e, k in zip(epochs, offsets)], np.int64)


def padding_fraction(lengths: np.ndarray, batches, max_length: int, bucket: int) -> float:
  """Share of padded tokens over ``batches`` when each is padded to its longest example
  rounded up to ``bucket`` (as :func:`simpletron_jax.data.common.make_batch`; 0 pads to
  ``max_length``).

  Args:
    lengths: ``[N]`` example lengths.
    batches: iterable of index arrays.
    max_length: truncation length.
    bucket: length bucket in tokens.

  Returns:
    padded tokens / all tokens, in [0, 1).
  """
  real = padded = 0
  for idx in batches:
    lens = np.minimum(lengths[np.asarray(idx)], max_length)
    width = bucketed_length(int(lens.max()), bucket, max_length)
    real += int(lens.sum())
    padded += width * len(lens)
  return 1.0 - real / padded
