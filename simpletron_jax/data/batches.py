"""The order in which a run reads its examples: seeded, resumable, padded to a length bucket.

A batch is padded to its longest example rounded up to ``bucket``, not to LRA's ``max_length``.
The index functions read no tokens, so :mod:`simpletron_jax.train.precompile` can list every
batch shape before a run starts.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterator

import grain
import jax
import ml_collections
import numpy as np

from simpletron_jax.data import grouping
from simpletron_jax.data.common import Batch, Split, bucketed_length, make_batch


@dataclasses.dataclass(frozen=True)
class BatchConfig:
  """The config fields batching reads, under their names (``max_length`` is
  ``model.max_length``, ``bucket`` and the last three ``data.*``); ``batch_size`` counts
  examples per optimizer step over all hosts, ``bucket`` and ``max_length`` tokens (bucket 0:
  pad to ``max_length``), ``eval_batch_size`` 0 means the micro-batch size."""
  batch_size: int
  max_length: int
  bucket: int
  grad_accum_steps: int = 1
  eval_batch_size: int = 0
  seed: int = 0
  group_by_length: bool = False
  group_pool_batches: int = 50
  drop_last_eval_batch: bool = False

  @classmethod
  def from_config_dict(cls, config: ml_collections.ConfigDict) -> BatchConfig:
    """The fields of ``config`` (``configs/``), the defaults above for those it lacks; raises
    ValueError when ``batch_size``, ``model.max_length`` or ``data.bucket`` is missing."""
    values = {}
    for holder, prefix, names in (
        (config, "", ("batch_size", "grad_accum_steps", "eval_batch_size", "seed")),
        (config.model, "model.", ("max_length",)),
        (config.data, "data.", ("bucket", "group_by_length", "group_pool_batches",
                                "drop_last_eval_batch"))):
      for name in names:
        if name in holder:
          values[name] = holder[name]
        elif cls.__dataclass_fields__[name].default is dataclasses.MISSING:
          raise ValueError(f"{prefix}{name} is missing: the config must set it")
    return cls(**values)

  @property
  def micro_batch_size(self) -> int:
    """Global examples per micro-step, all hosts together: ``batch_size // grad_accum_steps``."""
    return self.batch_size // self.grad_accum_steps

  def eval_rows(self, n_devices: int = 1) -> int:
    """``eval_batch_size`` (0: the micro-batch size) rounded up to a multiple of ``n_devices``."""
    rows = self.eval_batch_size or self.micro_batch_size
    return -(-rows // n_devices) * n_devices


def _host_rows(batch_size: int) -> slice:
  """The rows of a global batch this host feeds (all of them on one host)."""
  per_host = batch_size // jax.process_count()
  return slice(jax.process_index() * per_host, (jax.process_index() + 1) * per_host)


def batch_width(examples: Split, indices: np.ndarray, batch: BatchConfig) -> int:
  """Tokens per row of the global batch ``indices`` once padded: its longest example rounded
  up to ``bucket`` (at most ``max_length``)."""
  longest = int(min(examples.lengths[indices].max(initial=0), batch.max_length))
  return bucketed_length(longest, batch.bucket, batch.max_length)


def host_batch(examples: Split, indices: np.ndarray, batch: BatchConfig, valid=None) -> Batch:
  """This host's rows of the global batch ``indices`` (ints into ``examples``), padded to the
  global width (:func:`batch_width`); ``valid`` (bool, default all True) marks real rows.
  Returns :func:`~simpletron_jax.data.common.make_batch`'s numpy dict, inputs ``[rows, width]``.
  """
  width = batch_width(examples, indices, batch)
  rows = _host_rows(len(indices))
  out = make_batch(examples, indices[rows], max_length=batch.max_length, bucket=batch.bucket,
                   valid=None if valid is None else valid[rows])
  if out["inputs"].shape[1] < width:
    pad = width - out["inputs"].shape[1]
    for key in ("inputs", "mask", "inputs2", "mask2"):
      if key in out:
        out[key] = np.pad(out[key], ((0, 0), (0, pad)))
  return out


def train_batches(examples: Split, batch: BatchConfig, start_micro_step: int) -> Iterator[Batch]:
  """Endless stream of host-local training micro-batches from ``start_micro_step`` on; batch
  ``i`` is the same whether a run starts at 0 or resumes at ``i``."""
  ds = train_index_batches(examples, batch).map(
      lambda idx: host_batch(examples, np.asarray(idx), batch))
  ds = ds[start_micro_step:]
  return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=8)))


def train_index_batches(examples: Split, batch: BatchConfig) -> grain.MapDataset:
  """Endless ``grain.MapDataset`` of each training micro-batch's int indices into ``examples``:
  reshuffled every epoch from ``seed``, or with ``group_by_length`` grouped by length in pools
  of ``group_pool_batches`` micro-batches (:mod:`.grouping`).

  Raises:
    ValueError: when the split has fewer examples than one micro-batch.
  """
  micro = batch.micro_batch_size
  if len(examples) < micro:
    raise ValueError(f"the training split has {len(examples)} examples, fewer than one "
                     f"micro-batch of {micro} (config fields batch_size, grad_accum_steps)")
  if batch.group_by_length:
    return grain.MapDataset.source(grouping.GroupedBatches(
        examples.lengths, int(batch.seed), micro, batch.group_pool_batches))
  return (grain.MapDataset.range(len(examples)).shuffle(seed=int(batch.seed)).repeat()
          .batch(micro, drop_remainder=True))


def eval_batches(examples: Split, batch: BatchConfig, batch_size: int,
                 num_batches: int = -1) -> Iterator[Batch]:
  """Host-local batches of a split's examples, once each, sorted by length; filler rows of
  weight 0 complete the last. ``batch_size``: global rows. ``num_batches`` > 0: that many
  batches of a random subset fixed by ``seed``; -1 or 0: the whole split."""
  for idx, valid in eval_index_batches(examples, batch, batch_size, num_batches):
    yield host_batch(examples, idx, batch, valid)


def eval_index_batches(examples: Split, batch: BatchConfig, batch_size: int,
                       num_batches: int = -1) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """``(indices, valid)`` of each batch :func:`eval_batches` reads: ``batch_size`` int indices
  into ``examples`` and a bool mask, False for filler rows.

  ``drop_last_eval_batch`` drops the last ``len % batch_size`` examples in stored order, as
  LRA's ``batch(..., drop_remainder=True)`` does for image, Pathfinder and retrieval
  (``lra_benchmarks/image/input_pipeline.py``, ``matching/input_pipeline.py``); on retrieval,
  LRA's unseeded TSV shuffle drops other examples, the same count.

  Raises:
    ValueError: ``drop_last_eval_batch`` is on and the split is smaller than one batch.
  """
  order = np.arange(len(examples))
  if batch.drop_last_eval_batch:
    if len(order) < batch_size:
      raise ValueError(f"data.drop_last_eval_batch=True leaves nothing of a split of "
                       f"{len(order)} examples at eval batch size {batch_size}")
    order = order[:len(order) // batch_size * batch_size]
  n_batches = math.ceil(len(order) / batch_size)
  if num_batches and 0 < num_batches < n_batches:
    n_batches = num_batches
    order = np.random.default_rng(int(batch.seed)).permutation(order)[:n_batches * batch_size]
  order = order[np.argsort(examples.lengths[order], kind="stable")]
  for b in range(n_batches):
    idx = order[b * batch_size:(b + 1) * batch_size]
    valid = np.ones(batch_size, bool)
    valid[len(idx):] = False
    yield np.concatenate([idx, np.full(batch_size - len(idx), order[0])]), valid


def eval_batch_size(batch: BatchConfig) -> int:
  """Global rows per evaluation batch: ``eval_batch_size`` (0: the micro-batch size), rounded
  up to a multiple of the devices of all hosts."""
  return batch.eval_rows(jax.local_device_count() * jax.process_count())
