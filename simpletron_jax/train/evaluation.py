"""Accuracy, mean loss and majority-class rate of parameters on a split (metrics as LRA
``utils/train_utils.py``), merged on the devices and read once at the end."""

from __future__ import annotations

import jax

from simpletron_jax.data.batches import BatchConfig, eval_batch_size, eval_batches
from simpletron_jax.data.common import Split
from simpletron_jax.runtime import cli
from simpletron_jax.train.steps import (EvalMetrics, InFlightLimit, JitParallel, PmapParallel,
                                        means)

_merge = jax.jit(lambda a, b: a.merge(b))   # clu's merge of two Collections, one computation


def evaluate(p_eval_step, params_repl, examples: Split, batch_config: BatchConfig,
             num_batches: int = -1,
             parallel: PmapParallel | JitParallel | None = None) -> dict[str, float]:
  """Metrics of ``p_eval_step`` (of ``parallel``, default pmap's) over ``examples`` batched
  by ``batch_config``, or over ``num_batches`` of its batches (a fixed seeded subset; -1: all).
  Returns ``{"loss", "accuracy", "count", "majority_rate"}``, Python floats equal on every host:
  count in examples; majority_rate the accuracy of always answering the most frequent label of
  the examples read (:class:`steps.MajorityRate`, summed over all devices).

  Raises:
    KeyboardInterrupt, errors.Terminated: before a batch, a SIGINT or SIGTERM that arrived
      inside ``cli.sigint_raises`` / ``sigterm_raises`` and whose exception Python dropped (in
      a garbage-collector callback: a Ctrl-C during a validation or a final test was lost);
      :func:`simpletron_jax.runtime.cli.raise_if_terminated`.
  """
  parallel = parallel or PmapParallel()
  batch_size = eval_batch_size(batch_config)
  merged = None   # merged on the device; read once, after the last batch
  in_flight = InFlightLimit()
  for batch in eval_batches(examples, batch_config, batch_size, num_batches):
    cli.raise_if_terminated()   # a Ctrl-C or SIGTERM whose exception Python dropped
    metrics = p_eval_step(params_repl, parallel.put_batch(batch))
    merged = metrics if merged is None else _merge(merged, metrics)
    in_flight.add(merged)
  host = EvalMetrics.empty() if merged is None else parallel.host(merged)
  return {**means(host), "majority_rate": host.majority_rate.compute()}
