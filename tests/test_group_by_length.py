"""Length-grouped training order (``config.data.group_by_length``): seeded, resumable, a
permutation per epoch, and less padding."""

from __future__ import annotations

import itertools

import ml_collections
import numpy as np
import pytest

from simpletron_jax.data import batches, grouping
from tests.conftest import presence_examples

LENGTHS = np.random.default_rng(0).integers(500, 2000, 1000)


def test_every_epoch_is_a_seeded_permutation():
  orders = [grouping.grouped_epoch_order(LENGTHS, 0, e, 32, 8) for e in (0, 1)]
  for order in orders:
    np.testing.assert_array_equal(np.sort(order), np.arange(len(LENGTHS)))
  assert not np.array_equal(orders[0], orders[1])
  np.testing.assert_array_equal(orders[0], grouping.grouped_epoch_order(LENGTHS, 0, 0, 32, 8))
  assert not np.array_equal(orders[0], grouping.grouped_epoch_order(LENGTHS, 1, 0, 32, 8))


def test_stream_batches_are_pure_and_cover_each_epoch_once():
  lengths = LENGTHS[:960]                      # 30 batches of 32 per epoch
  stream = grouping.GroupedBatches(lengths, 0, 32, 8)
  first_epoch = np.concatenate([stream[i] for i in range(30)])
  np.testing.assert_array_equal(np.sort(first_epoch), np.arange(960))
  fresh = grouping.GroupedBatches(lengths, 0, 32, 8)
  for i in (45, 3, 31):                        # any order, any epoch
    np.testing.assert_array_equal(fresh[i], stream[i])


def test_grouping_cuts_padding():
  def batches(stream):
    return [stream[i] for i in range(len(LENGTHS) // 32)]
  grouped = grouping.padding_fraction(LENGTHS, batches(grouping.GroupedBatches(LENGTHS, 0, 32, 8)),
                                      2000, 128)
  rng = np.random.default_rng(0)
  plain = grouping.padding_fraction(LENGTHS, rng.permutation(992).reshape(-1, 32), 2000, 128)
  assert grouped < plain / 3


def test_bad_pool_size_names_the_field():
  with pytest.raises(ValueError, match="data.group_pool_batches"):
    grouping.grouped_epoch_order(LENGTHS, 0, 0, 32, 0)


def _config(group: bool) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict({"seed": 3, "batch_size": 8, "grad_accum_steps": 1})
  config.data = ml_collections.ConfigDict({"bucket": 8, "group_by_length": group,
                                           "group_pool_batches": 4})
  config.model = ml_collections.ConfigDict({"max_length": 64})
  return config


def test_train_batches_resume_at_any_micro_step():
  examples = presence_examples(100, np.random.default_rng(1))
  config = batches.BatchConfig.from_config_dict(_config(True))
  run = list(itertools.islice(batches.train_batches(examples, config, 0), 30))
  resumed = list(itertools.islice(batches.train_batches(examples, config, 17), 13))
  for a, b in zip(run[17:], resumed):
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])
  widths = [b["inputs"].shape[1] for b in run]
  plain = [b["inputs"].shape[1]
           for b in itertools.islice(batches.train_batches(
               examples, batches.BatchConfig.from_config_dict(_config(False)), 0), 30)]
  assert sum(widths) < sum(plain)
