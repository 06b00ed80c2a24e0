"""The order in which a run reads its examples: seeded, resumable, padded to a length bucket.

A batch is padded to its longest example rounded up to ``config.data.bucket``, not to LRA's
``max_length``. The index functions read no tokens, so :mod:`simpletron_jax.train.precompile`
can list every batch shape before a run starts.
"""

from __future__ import annotations

import math
from typing import Iterator

import grain
import jax
import ml_collections
import numpy as np

from simpletron_jax.data import grouping
from simpletron_jax.data.common import Batch, Split, bucketed_length, make_batch


def _host_rows(batch_size: int) -> slice:
  """The rows of a global batch this host feeds (all of them on one host)."""
  per_host = batch_size // jax.process_count()
  return slice(jax.process_index() * per_host, (jax.process_index() + 1) * per_host)


def micro_batch_size(config: ml_collections.ConfigDict) -> int:
  """Global examples per micro-step, all hosts together: ``batch_size // grad_accum_steps``."""
  return config.batch_size // config.grad_accum_steps


def batch_width(examples: Split, indices: np.ndarray, config) -> int:
  """Tokens per row of the global batch ``indices`` once padded: its longest example rounded
  up to the ``config.data.bucket`` (at most ``config.model.max_length``)."""
  longest = int(min(examples.lengths[indices].max(initial=0), config.model.max_length))
  return bucketed_length(longest, config.data.bucket, config.model.max_length)


def host_batch(examples: Split, indices: np.ndarray, config, valid=None) -> Batch:
  """This host's rows of the global batch ``indices`` (ints into ``examples``), padded to the
  global width (:func:`batch_width`); ``valid`` (bool, default all True) marks real rows.
  Returns :func:`~simpletron_jax.data.common.make_batch`'s numpy dict, inputs ``[rows, width]``.
  """
  width = batch_width(examples, indices, config)
  rows = _host_rows(len(indices))
  batch = make_batch(examples, indices[rows], max_length=config.model.max_length,
                     bucket=config.data.bucket,
                     valid=None if valid is None else valid[rows])
  if batch["inputs"].shape[1] < width:
    pad = width - batch["inputs"].shape[1]
    for key in ("inputs", "mask", "inputs2", "mask2"):
      if key in batch:
        batch[key] = np.pad(batch[key], ((0, 0), (0, pad)))
  return batch


def train_batches(examples: Split, config: ml_collections.ConfigDict,
                  start_micro_step: int) -> Iterator[Batch]:
  """Endless stream of host-local training micro-batches from ``start_micro_step`` on; batch
  ``i`` is the same whether a run starts at 0 or resumes at ``i``."""
  ds = train_index_batches(examples, config).map(
      lambda idx: host_batch(examples, np.asarray(idx), config))
  ds = ds[start_micro_step:]
  return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=8)))


def train_index_batches(examples: Split, config: ml_collections.ConfigDict) -> grain.MapDataset:
  """Endless ``grain.MapDataset`` of each training micro-batch's int indices into ``examples``:
  reshuffled every epoch from ``config.seed``, or with ``data.group_by_length`` grouped by
  length in pools of ``data.group_pool_batches`` micro-batches (:mod:`.grouping`).

  Raises:
    ValueError: when the split has fewer examples than one micro-batch.
  """
  micro = micro_batch_size(config)
  if len(examples) < micro:
    raise ValueError(f"the training split has {len(examples)} examples, fewer than one "
                     f"micro-batch of {micro} (config fields batch_size, grad_accum_steps)")
  if config.data.get("group_by_length", False):
    return grain.MapDataset.source(grouping.GroupedBatches(
        examples.lengths, int(config.seed), micro, config.data.get("group_pool_batches", 50)))
  return (grain.MapDataset.range(len(examples)).shuffle(seed=int(config.seed)).repeat()
          .batch(micro, drop_remainder=True))


def eval_batches(examples: Split, config: ml_collections.ConfigDict, batch_size: int,
                 num_batches: int = -1) -> Iterator[Batch]:
  """Host-local batches of a split's examples, once each, sorted by length; filler rows of
  weight 0 complete the last. ``batch_size``: global rows. ``num_batches`` > 0: that many
  batches of a random subset fixed by ``config.seed``; -1 or 0: the whole split."""
  for idx, valid in eval_index_batches(examples, config, batch_size, num_batches):
    yield host_batch(examples, idx, config, valid)


def eval_index_batches(examples: Split, config: ml_collections.ConfigDict, batch_size: int,
                       num_batches: int = -1) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """``(indices, valid)`` of each batch :func:`eval_batches` reads: ``batch_size`` int indices
  into ``examples`` and a bool mask, False for filler rows.

  ``data.drop_last_eval_batch`` drops the last ``len % batch_size`` examples in stored order, as
  LRA's ``batch(..., drop_remainder=True)`` does for image, Pathfinder and retrieval
  (``lra_benchmarks/image/input_pipeline.py``, ``matching/input_pipeline.py``); on retrieval,
  LRA's unseeded TSV shuffle drops other examples, the same count.

  Raises:
    ValueError: ``data.drop_last_eval_batch`` is on and the split is smaller than one batch.
  """
  order = np.arange(len(examples))
  if config.data.get("drop_last_eval_batch", False):
    if len(order) < batch_size:
      raise ValueError(f"data.drop_last_eval_batch=True leaves nothing of a split of "
                       f"{len(order)} examples at eval batch size {batch_size}")
    order = order[:len(order) // batch_size * batch_size]
  n_batches = math.ceil(len(order) / batch_size)
  if num_batches and 0 < num_batches < n_batches:
    n_batches = num_batches
    order = np.random.default_rng(int(config.seed)).permutation(order)[:n_batches * batch_size]
  order = order[np.argsort(examples.lengths[order], kind="stable")]
  for b in range(n_batches):
    idx = order[b * batch_size:(b + 1) * batch_size]
    valid = np.ones(batch_size, bool)
    valid[len(idx):] = False
    yield np.concatenate([idx, np.full(batch_size - len(idx), order[0])]), valid


def eval_batch_size(config: ml_collections.ConfigDict) -> int:
  """Global rows per evaluation batch: ``config.eval_batch_size`` (0: the micro-batch size),
  rounded up to a multiple of the devices of all hosts."""
  n_dev = jax.local_device_count()
  batch_size = config.eval_batch_size or micro_batch_size(config)
  return -(-batch_size // (n_dev * jax.process_count())) * n_dev * jax.process_count()
