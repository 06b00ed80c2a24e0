"""Evaluating parameters on a split: accuracy, mean loss and the majority-class rate.

The metrics are LRA's (``utils/train_utils.py``): the eval step's clu ``Collection``
(:data:`simpletron_jax.train.steps.Metrics`) of each batch, merged on the devices and read once
at the end, so filler rows never count and a limited evaluation
(``num_eval_steps``, ``num_test_steps``) reads a fixed seeded subset
(:func:`simpletron_jax.data.batches.eval_batches`).
"""

from __future__ import annotations

import collections

import jax
import ml_collections

from simpletron_jax.data.batches import eval_batch_size, eval_batches
from simpletron_jax.data.common import Split
from simpletron_jax.runtime import distributed
from simpletron_jax.train.steps import InFlightLimit, JitParallel, Metrics, PmapParallel, means

_merge = jax.jit(lambda a, b: a.merge(b))   # clu's merge of two Collections, one computation


def evaluate(p_eval_step, params_repl, examples: Split, config: ml_collections.ConfigDict,
             num_batches: int = -1,
             parallel: PmapParallel | JitParallel | None = None) -> dict[str, float]:
  """Accuracy and mean loss over a split (or ``num_batches`` batches of it, see
  :func:`eval_batches`). At most :data:`simpletron_jax.train.steps.CALLS_IN_FLIGHT` batches are
  unfinished at once (:class:`InFlightLimit`).

  Args:
    p_eval_step: the eval step of ``parallel.steps`` (:func:`simpletron_jax.train.steps.pmap_steps`
      by default).
    params_repl: the parameters as that step takes them (``parallel.put_state``).
    examples: the split.
    config: the run config (batch size, bucket, max_length).
    num_batches: batches to read; -1 for the whole split.
    parallel: :func:`simpletron_jax.train.steps.make_parallel` of the run (default: pmap's).

  Returns:
    ``{"accuracy", "loss", "count", "majority_rate"}`` (the
    :data:`simpletron_jax.train.steps.Metrics` means,
    :func:`simpletron_jax.train.steps.means`): count in examples, and majority_rate the
    share of the most frequent label among the examples read (by all hosts), the accuracy of always
    answering that label. Equal on every host.
  """
  parallel = parallel or PmapParallel()
  batch_size = eval_batch_size(config)
  merged = None   # merged on the device; read once, after the last batch
  in_flight = InFlightLimit()
  label_counts: collections.Counter = collections.Counter()
  for batch in eval_batches(examples, config, batch_size, num_batches):
    metrics = p_eval_step(params_repl, parallel.put_batch(batch))
    merged = metrics if merged is None else _merge(merged, metrics)
    in_flight.add(merged)
    label_counts.update(batch["targets"][batch["weights"] > 0].tolist())
  label_counts = distributed.sum_label_counts(label_counts)
  read = sum(label_counts.values())
  return {**means(Metrics.empty() if merged is None else parallel.host(merged)),
          "majority_rate": max(label_counts.values()) / read if read else 0.0}
