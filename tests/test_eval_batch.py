"""Validation in large batches, and the padding-exact ListOps cell at a few widths: the same numbers.

The ListOps SimpleTRON cells (scripts/reproduce.py, cells 4 and 5b) validate in batches of
``eval_batch_size`` rows instead of the micro-batch's 32, and cell 5b pads its batches to
buckets of 512 tokens instead of to the full width. These tests check on CPU, in float32, that
neither changes what is computed:

* :func:`simpletron_jax.train.evaluation.evaluate` gives the same accuracy, count and
  majority-class rate, and the same mean loss within float32 summation, at batch 32 and in
  one batch of the whole split, for the padding-exact ``simple`` (its batches at bucketed
  widths, which differ between the two batchings) and the authors' function (``:authors``,
  every batch at full width).

  Tolerance of the loss: each example's loss is the same function of the same logits, but the
  sums run in float32 in another order (within a batch on the device, then batch by batch), and
  XLA may block a matmul differently for another batch shape, so the logits may differ in their
  last bits. Reordering a float32 sum of ``n`` positive terms moves it by at most about
  ``n * 2**-24`` of itself: 4e-6 for this test's 70 examples (hence ``rtol=1e-5``) and 1.2e-4
  for ListOps' 2,000 (in practice near ``sqrt(n) * 2**-24``). Accuracy and count are sums of
  integers below 2**24 in float32, exact; an example's prediction could only flip on a tie of
  two logits within that rounding.
* A bucketed batch gives every example the logits and the gradient (of its own loss, one
  example at a time) it has at full width, with cell 5b's model options (``block_diagonal``,
  the CLS-only last block, ``length_multiple=8``).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.listops import simple as simple_config
from simpletron_jax.data import batches, listops
from simpletron_jax.data.common import RaggedExamples, bucketed_length
from simpletron_jax.model import encoders
from simpletron_jax.train import evaluation, precompile, run_config, steps, train_state

MAX_LENGTH = 64


def _config(variant: str, layers: int = 1, **fields):
  """A ListOps ``simple`` config of ``variant`` (``tiny``: padding-exact, or ``tiny_authors``)
  at a CPU size: ``layers`` layers of 16, ``max_length`` 64, batch 32, buckets of 16 tokens
  (``tiny``) or full width (``tiny_authors``)."""
  config = simple_config.get_config(variant)
  config.model.emb_dim = config.model.qkv_dim = 16
  config.model.mlp_dim = 32
  config.model.num_heads = 2
  config.model.num_layers = layers
  config.model.max_length = MAX_LENGTH
  config.batch_size = 32
  config.data.bucket = 0 if "authors" in variant else 16
  for key, value in fields.items():
    target = config
    *path, leaf = key.split(".")
    for part in path:
      target = target[part]
    target[leaf] = value
  return config


def _split(n: int = 70, seed: int = 0) -> RaggedExamples:
  """``n`` ListOps-vocabulary sequences of 4 to 64 tokens with random labels."""
  rng = np.random.default_rng(seed)
  seqs = [rng.integers(1, listops.VOCAB_SIZE, int(rng.integers(4, MAX_LENGTH + 1)))
          for _ in range(n)]
  return RaggedExamples.from_sequences(seqs, rng.integers(0, listops.NUM_CLASSES, n))


def _model_and_params(config):
  model = encoders.build_classifier(config.model, vocab_size=listops.VOCAB_SIZE,
                                    num_classes=listops.NUM_CLASSES)
  state = train_state.create_train_state(
      run_config.TrainConfig.from_config_dict(config), model, jax.random.PRNGKey(0),
      config.model.max_length)
  # Trained-looking parameters: the initial ones give nearly equal logits for every class.
  params = jax.tree_util.tree_map(
      lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(1), x.shape, x.dtype),
      state.params)
  return model, params


@pytest.mark.parametrize("variant", ["tiny", "tiny_authors"])
def test_large_eval_batches_give_the_metrics_of_batch_32(variant):
  examples = _split()
  config = _config(variant)
  model, params = _model_and_params(config)
  parallel = steps.PmapParallel()
  _, p_eval = parallel.steps(model.apply)
  params_repl = parallel.put_state(params)
  results, widths = {}, {}
  for eval_batch in (0, 70):   # 0: the micro-batch, 32: 3 batches (6 filler rows); 70: 1
    config = batches.BatchConfig.from_config_dict(_config(variant, eval_batch_size=eval_batch))
    size = batches.eval_batch_size(config)
    widths[size] = [batches.batch_width(examples, idx, config)
                    for idx, _ in batches.eval_index_batches(examples, config, size)]
    results[size] = evaluation.evaluate(p_eval, params_repl, examples, config, -1, parallel)
  assert sorted(results) == [32, 70]
  if variant == "tiny":   # the batchings meet other widths: a real test of the bucketing
    assert widths[32] != widths[70] and len(set(widths[32])) > 1
  else:                   # the authors' function: every batch at full width
    assert {w for ws in widths.values() for w in ws} == {MAX_LENGTH}
  reference = results[32]
  assert reference["count"] == 70 and 0.0 < reference["accuracy"] < 1.0
  got = results[70]
  assert got["count"] == reference["count"]
  assert got["accuracy"] == reference["accuracy"]
  assert got["majority_rate"] == reference["majority_rate"]
  np.testing.assert_allclose(got["loss"], reference["loss"], rtol=1e-5)


def _fast_model(config):
  """Cell 5b's model options on the CPU config."""
  config.model.attention_kwargs.block_diagonal = True
  config.model.last_block_cls_only = True
  config.model.length_multiple = 8
  return config


def test_bucketed_widths_keep_each_examples_logits_and_gradient():
  examples = _split()
  config = _fast_model(_config("tiny", layers=2))
  full_config = _fast_model(_config("tiny", layers=2, **{"data.bucket": 0}))
  model, params = _model_and_params(config)
  idx = np.flatnonzero(examples.lengths <= 40)[:8]   # mixed lengths, all below 48
  bucketed = batches.host_batch(examples, idx, batches.BatchConfig.from_config_dict(config))
  full = batches.host_batch(examples, idx, batches.BatchConfig.from_config_dict(full_config))
  assert bucketed["inputs"].shape[1] < full["inputs"].shape[1] == MAX_LENGTH

  def logits(p, inputs):
    return model.apply({"params": p}, inputs, None, deterministic=True)

  def example_grads(p, inputs, targets):   # one example at a time: [rows] gradient trees
    def loss(p, x, y):
      return -jax.nn.log_softmax(logits(p, x[None]))[0, y]
    return jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(p, inputs, targets)

  run = jax.jit(lambda p, x, y: (logits(p, x), example_grads(p, x, y)))
  logits_b, grads_b = run(params, jnp.asarray(bucketed["inputs"]), bucketed["targets"])
  logits_f, grads_f = run(params, jnp.asarray(full["inputs"]), full["targets"])
  chex.assert_shape(logits_b, (8, listops.NUM_CLASSES))
  chex.assert_trees_all_close(logits_b, logits_f, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(grads_b, grads_f, rtol=1e-4, atol=1e-6)
  # The gradients differ between examples: a per-example check, not one of a batch mean.
  first = jax.tree_util.tree_leaves(grads_b)[0]
  assert not np.allclose(first[0], first[1])


def test_512_token_buckets_give_four_widths_and_precompile_finds_the_eval_ones():
  # Cell 5b's buckets at ListOps' max_length: every length maps to one of four widths.
  assert {bucketed_length(n, 512, 2000) for n in range(1, 2001)} == {512, 1024, 1536, 2000}
  examples = _split()
  config = batches.BatchConfig.from_config_dict(_config("tiny", eval_batch_size=48))
  found = precompile.eval_batches_by_width(examples, config, -1)
  met = {batch["inputs"].shape for batch in batches.eval_batches(examples, config, 48)}
  assert {b["inputs"].shape for b in found.values()} == met
  assert all(shape[0] == 48 for shape in met)


def test_a_grouped_run_is_scanned_past_its_first_epoch_for_widths():
  # 96,000 examples in micro-batches of 32: one epoch is 3,000; paper ListOps trains 15,000.
  config = _config("tiny", num_train_steps=15000)
  assert precompile.train_scan_count(  # ungrouped: one epoch
      batches.BatchConfig.from_config_dict(config), config.num_train_steps, 96000, 0) == 3000
  config.data.group_by_length = True
  assert precompile.train_scan_count(  # grouped: the whole run
      batches.BatchConfig.from_config_dict(config), config.num_train_steps, 96000, 0) == 15000
  assert precompile.train_scan_count(
      batches.BatchConfig.from_config_dict(config), config.num_train_steps, 96000, 14000) == 1000
  config.num_train_steps = 100000
  assert precompile.train_scan_count(
      batches.BatchConfig.from_config_dict(config), config.num_train_steps, 96000,
      0) == precompile.SCAN_MICRO_BATCHES

