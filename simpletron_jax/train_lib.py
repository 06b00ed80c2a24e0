"""Training and evaluation: optimizer, pmapped steps, data order, checkpoints, the loop.

The recipe follows LRA ``utils/train_utils.py`` and ``listops/train.py``
(Tay et al., 2020), with these changes: optax AdamW instead of flax.optim,
seeded data order, batches padded to a length bucket instead of to
``max_length``, metrics as sums over real examples, orbax checkpoints that a
killed run resumes from, and test evaluations of both the final parameters
(LRA's protocol) and the best-validation checkpoint (SimpleTRON's).

Units: a *step* is one optimizer update on ``config.batch_size`` examples; with
``config.grad_accum_steps = A`` it is made of A *micro-steps* of
``batch_size / A`` examples each (``optax.MultiSteps``).
"""

from __future__ import annotations

import collections
import functools
import json
import math
import os
import shutil
import sys
import time
from typing import Any, Callable, Iterator

import flax
import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
import tqdm
from flax.training import train_state

from simpletron_jax import distributed, lora, models, run_guard, schedules, tasks, transfer
from simpletron_jax.data import grouping
from simpletron_jax.data.common import (PairedExamples, Split, bucketed_length, make_batch,
                                        report_split_truncation)
from simpletron_jax.metric_logging import MetricLogger

AXIS = "batch"
Batch = dict[str, np.ndarray]


class TrainState(train_state.TrainState):
  """flax TrainState; ``step`` counts micro-steps (see the module docstring)."""


# ----------------------------------------------------------------------------
# Config checks, optimizer, state.


def validate_config(config: ml_collections.ConfigDict, n_devices: int,
                    n_hosts: int = 1) -> None:
  """Checks every model, data and training field of ``config`` before any work (issue 27).

  The optimizer, schedule and bookkeeping fields are checked by
  :func:`run_guard.check_settings`; :func:`train_and_evaluate` calls both first.

  Args:
    config: the run config.
    n_devices: devices over all hosts (``jax.device_count()``).
    n_hosts: processes of a multi-host run (``jax.process_count()``), for the message.

  Raises:
    ValueError: one line naming the field and its value: an unknown ``task`` (with the
      known ones); ``seed`` or ``data.seed`` not an int >= 0; ``batch_size``,
      ``num_train_steps``, ``eval_frequency``, ``checkpoint_every``, ``log_every``,
      ``grad_accum_steps`` or a ``model`` size (``emb_dim``, ``qkv_dim``, ``mlp_dim``,
      ``num_heads``, ``num_layers``, ``max_length``) not a positive int; ``eval_batch_size``
      < 0, ``num_eval_steps`` or ``num_test_steps`` < -1; ``batch_size`` not divisible by
      ``grad_accum_steps`` times the global device count; ``model.dropout_rate``,
      ``model.attention_dropout_rate`` or a ``model.attention_kwargs.*dropout*`` rate
      outside [0, 1); ``data.bucket`` < 0, ``data.group_pool_batches`` < 1,
      ``data.val_fraction`` outside [0, 1); ``lora.rank`` or ``lora.alpha`` < 0; or any
      ``model.*`` problem found by :func:`simpletron_jax.models.validate_model_config` (an
      unknown attention, pooling or dtype with the known ones, ``qkv_dim`` not divisible by
      ``num_heads``, ...).
  """
  if config.task not in tasks._LOADERS:  # pylint: disable=protected-access
    raise ValueError(f"task={config.task!r} is not a task; known: "
                     f"{', '.join(sorted(tasks._LOADERS))}")  # pylint: disable=protected-access
  check = run_guard.check_range
  check("seed", config.seed, low=0, integer=True)
  for field in ("batch_size", "num_train_steps", "eval_frequency", "checkpoint_every",
                "log_every", "grad_accum_steps"):
    check(field, config[field], low=1, integer=True)
  check("eval_batch_size", config.get("eval_batch_size", 0), low=0, integer=True,
        hint=" (0: the micro-batch size)")
  for field in ("num_eval_steps", "num_test_steps"):
    check(field, config.get(field, -1), low=-1, integer=True, hint=" (-1: the whole split)")
  model = config.model
  for field in ("emb_dim", "qkv_dim", "mlp_dim", "num_heads", "num_layers", "max_length"):
    check(f"model.{field}", model[field], low=1, integer=True)
  for field in ("dropout_rate", "attention_dropout_rate"):
    check(f"model.{field}", model[field], low=0, high=1, high_open=True)
  for key, value in (model.get("attention_kwargs") or {}).items():
    if "dropout" in key and not isinstance(value, bool):
      check(f"model.attention_kwargs.{key}", value, low=0, high=1, high_open=True)
  data = config.data
  if "seed" in data:
    check("data.seed", data.seed, low=0, integer=True)
  check("data.bucket", data.get("bucket", 0), low=0, integer=True, hint=" (0: max_length)")
  check("data.group_pool_batches", data.get("group_pool_batches", 1), low=1, integer=True)
  if "val_fraction" in data:
    check("data.val_fraction", data.val_fraction, low=0, high=1, high_open=True)
  if "lora" in config:
    check("lora.rank", config.lora.get("rank", 0), low=0, integer=True, hint=" (0: no LoRA)")
    check("lora.alpha", config.lora.get("alpha", 0.0), low=0, hint=" (0: alpha = rank)")
  if model.qkv_dim % model.num_heads:
    divisors = [h for h in range(1, model.qkv_dim + 1) if model.qkv_dim % h == 0][:8]
    raise ValueError(f"model.qkv_dim={model.qkv_dim} is not divisible by model.num_heads="
                     f"{model.num_heads}: each head gets qkv_dim / num_heads features; set "
                     f"model.num_heads to a divisor of {model.qkv_dim} "
                     f"({', '.join(map(str, divisors))}, ...) or change model.qkv_dim")
  models.validate_model_config(model)
  if config.batch_size % (config.grad_accum_steps * n_devices):
    hosts = (f" of all hosts ({n_hosts} host(s) x {n_devices // n_hosts} local device(s))"
             if n_hosts > 1 else "")
    raise ValueError(
        f"batch_size={config.batch_size} must be divisible by grad_accum_steps="
        f"{config.grad_accum_steps} times the {n_devices} device(s){hosts}: use a "
        f"multiple of {config.grad_accum_steps * n_devices}")


def make_schedule(config: ml_collections.ConfigDict) -> Callable:
  """The learning-rate schedule of ``config`` (steps are optimizer updates)."""
  return schedules.create_learning_rate_schedule(
      factors=config.factors, base_learning_rate=config.learning_rate,
      warmup_steps=config.warmup, steps_per_cycle=config.num_train_steps)


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """AdamW with LRA's decoupled decay ``p -= lr * wd * p`` on every parameter.

  Preceded by global-norm gradient clipping when ``config.grad_clip_norm > 0`` (LRA's
  Path-X recipe). Parameters matching a ``config.freeze`` regex, and the base parameters
  of a LoRA run (``config.lora.rank > 0``), get zero updates (:func:`transfer.freeze`).
  Wrapped in ``optax.MultiSteps`` when ``config.grad_accum_steps > 1``, so the schedule
  advances once per optimizer update.
  """
  tx = optax.adamw(make_schedule(config), b1=config.adam_b1, b2=config.adam_b2,
                   eps=config.adam_eps, weight_decay=config.weight_decay)
  clip = float(config.get("grad_clip_norm", 0.0) or 0.0)
  if clip > 0:
    tx = optax.chain(optax.clip_by_global_norm(clip), tx)
  frozen = tuple(config.get("freeze", ()) or ())
  if config.get("lora", {}).get("rank", 0) > 0:
    frozen += (f"^{lora.BASE}/",)
  if frozen:
    tx = transfer.freeze(tx, frozen)
  if config.grad_accum_steps > 1:
    tx = optax.MultiSteps(tx, every_k_schedule=config.grad_accum_steps)
  return tx


def create_train_state(config: ml_collections.ConfigDict, model: flax.linen.Module,
                       rng: jax.Array) -> TrainState:
  """Initialises parameters and optimizer state (unreplicated).

  Args:
    config: the run config.
    model: a :class:`simpletron_jax.models.ClassificationEncoder`.
    rng: the parameter-init key.

  Returns:
    A TrainState at step 0. With ``config.lora.rank > 0`` its params are the LoRA tree
    ``{"base", "lora"}`` and its ``apply_fn`` merges them (:mod:`simpletron_jax.lora`).
  """
  length = min(config.model.max_length, 16)
  tokens = jnp.ones((1, length), jnp.int32)
  second = (tokens, None) if isinstance(model, models.DualEncoderClassifier) else ()
  params = jax.jit(lambda r: model.init({"params": r}, tokens, None, *second,
                                        deterministic=True))(rng)["params"]
  apply_fn, rank = model.apply, config.get("lora", {}).get("rank", 0)
  if rank > 0:
    params = lora.wrap(params, config.lora.targets, rank, jax.random.fold_in(rng, 0x10A))
    apply_fn = lora.wrap_apply(model.apply, lora.scale_of(rank, config.lora.alpha))
  return TrainState.create(apply_fn=apply_fn, params=params, tx=make_optimizer(config))


# ----------------------------------------------------------------------------
# Loss and steps.


def metric_sums(logits_BxC, targets_B, weights_B) -> dict[str, jnp.ndarray]:
  """Weighted sums of cross-entropy and correct predictions.

  Args:
    logits_BxC: float logits.
    targets_B: int labels.
    weights_B: float, 1 for a real example and 0 for a filler row.

  Returns:
    ``{"loss": sum w*CE, "correct": sum w*[argmax == target], "count": sum w}``
    as float32 scalars.
  """
  loss_B = optax.softmax_cross_entropy_with_integer_labels(logits_BxC.astype(jnp.float32),
                                                           targets_B)
  correct_B = (jnp.argmax(logits_BxC, -1) == targets_B).astype(jnp.float32)
  return {"loss": jnp.sum(loss_B * weights_B), "correct": jnp.sum(correct_B * weights_B),
          "count": jnp.sum(weights_B)}


def loss_fn(params, apply_fn, batch: Batch, dropout_rng, deterministic: bool):
  """Mean cross-entropy over the real examples of ``batch``.

  Args:
    params: model parameters.
    apply_fn: ``model.apply``.
    batch: ``inputs`` ``[B, L]`` int32, ``mask`` ``[B, L]`` bool, ``targets``
      ``[B]`` int32, ``weights`` ``[B]`` float32; for the dual encoder also
      ``inputs2`` and ``mask2``.
    dropout_rng: key for dropout; a key folded from it feeds the
      ``random_features`` collection (Performer with ``redraw=True``).
    deterministic: disables dropout.

  Returns:
    ``(loss scalar, metric_sums dict)``.
  """
  second = (batch["inputs2"], batch["mask2"]) if "inputs2" in batch else ()
  logits = apply_fn({"params": params}, batch["inputs"], batch["mask"], *second,
                    deterministic=deterministic,
                    rngs={"dropout": dropout_rng,
                          "random_features": jax.random.fold_in(dropout_rng, 0x5EED)})
  sums = metric_sums(logits, batch["targets"], batch["weights"])
  return sums["loss"] / jnp.maximum(sums["count"], 1.0), sums


def train_step(state: TrainState, batch: Batch, dropout_rng):
  """One micro-step on this device's shard; call it under ``pmap(axis_name="batch")``.

  Gradients are ``pmean``ed and metric sums ``psum``med over the devices.

  Returns:
    ``(new_state, metrics)``: the metric sums over the global micro-batch, and
    ``grad_norm``, the global L2 norm of the averaged gradient (the non-finite guard reads it).
  """
  dropout_rng = jax.random.fold_in(dropout_rng, jax.lax.axis_index(AXIS))
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  (_, sums), grads = grad_fn(state.params, state.apply_fn, batch, dropout_rng, False)
  grads = jax.lax.pmean(grads, AXIS)
  metrics = {**jax.lax.psum(sums, AXIS), "grad_norm": optax.tree.norm(grads)}
  return state.apply_gradients(grads=grads), metrics


def eval_step(params, apply_fn, batch: Batch):
  """Metric sums of one deterministic forward pass, ``psum``med over devices."""
  _, sums = loss_fn(params, apply_fn, batch, jax.random.PRNGKey(0), True)
  return jax.lax.psum(sums, AXIS)


def pmap_steps(apply_fn, devices=None):
  """Pmapped train and eval steps over ``devices`` (default: all local devices).

  Returns:
    ``(p_train_step(state, batch, rng), p_eval_step(params, batch))`` taking
    state and params replicated over the devices and batches of shape
    ``[n_devices, B / n_devices, ...]``.
  """
  p_train = jax.pmap(train_step, axis_name=AXIS, in_axes=(0, 0, None),
                     donate_argnums=(0,), devices=devices)
  p_eval = jax.pmap(lambda p, b: eval_step(p, apply_fn, b), axis_name=AXIS, devices=devices)
  return p_train, p_eval


def batch_shape_key(batch: Batch) -> tuple:
  """``((field, shape), ...)`` of a batch, sorted by field: one compiled step per key."""
  return tuple(sorted((k, tuple(v.shape)) for k, v in batch.items()))


@functools.lru_cache(maxsize=None)
def _pmapped_identity(devices: tuple | None) -> Callable:
  return jax.pmap(lambda tree: tree, axis_name=AXIS, devices=devices)


def replicate(tree, devices=None):
  """One copy of every leaf per device, laid out as the pmapped steps return their state.

  ``flax.jax_utils.replicate`` places the copies under a sharding whose mesh axis is not
  :data:`AXIS`. JAX (0.10) implements ``pmap`` with ``jit``, whose cache key includes the
  input shardings, so the state the first train step returns differs in sharding from the
  state it was given, and the second step built the whole train step again (2.2 s on CPU for
  the paper ListOps config at batch 2 with the persistent cache on,
  ``benchmarks/results/cpu/replicate_compiles.md``). Passing the copies through a
  pmapped identity gives them the steps' own output sharding, so each batch shape compiles
  once. (Called AOT-compiled steps, as in the benchmarks, never recompiled.)

  Args:
    tree: a pytree of arrays or scalars (e.g. a ``TrainState`` or its ``params``).
    devices: the devices of :func:`pmap_steps` (default: all local devices).

  Returns:
    The same pytree with every leaf ``x`` as a ``[n_devices, *x.shape]`` array of the same
    dtype on those devices.
  """
  n = len(devices) if devices else jax.local_device_count()
  host = jax.tree_util.tree_map(lambda x: np.broadcast_to(np.asarray(x), (n, *np.shape(x))),
                                tree)
  return _pmapped_identity(tuple(devices) if devices else None)(host)


def unreplicate(tree):
  """The first device's copy of every leaf of a pmapped (``[n_devices, ...]``) tree."""
  return jax.tree_util.tree_map(lambda x: x[0], tree)


def shard(batch: Batch, n_devices: int) -> Batch:
  """Reshapes every ``[B, ...]`` array to ``[n_devices, B / n_devices, ...]``."""
  return {k: v.reshape(n_devices, -1, *v.shape[1:]) for k, v in batch.items()}


# How many device calls (train micro-steps, eval batches) may be unfinished at once.
CALLS_IN_FLIGHT = 4


class InFlightLimit:
  """Keeps at most ``limit`` dispatched device calls unfinished; older ones are waited for.

  JAX dispatches asynchronously, so a loop over batches can run ahead of the devices. On
  a host with several XLA CPU devices (``--xla_force_host_platform_device_count``, as in
  the tests) running ahead far enough deadlocks: each CPU device accepts at most 32
  unfinished computations, and a launch past that waits for a slot *on one of the client's
  worker threads* (as many as the cores, at least as many as the devices). When every
  worker waits like that or in a collective's rendezvous, the computations that would free
  a slot never run, and XLA aborts the process after 40 s (``Termination timeout ... all
  reduce``). Seen as "Fatal Python error: Aborted" in an evaluation on a loaded 2-core
  machine, and reproduced there with a plain pmap-psum-and-add loop
  (``benchmarks/dispatch_deadlock.py``, results in
  ``benchmarks/results/cpu/dispatch_deadlock/``). On an accelerator the bound still leaves
  ``limit`` calls queued, which should keep it busy; that is not yet measured on a GPU.

  Args:
    limit: calls kept in flight (>= 1). Each call may be several computations (an eval
      batch and its running sum), so ``limit`` times that must stay under 32.

  Raises:
    ValueError: ``limit`` < 1.
  """

  def __init__(self, limit: int = CALLS_IN_FLIGHT):
    if limit < 1:
      raise ValueError(f"limit={limit} must be >= 1")
    self.limit = limit
    self._pending: collections.deque = collections.deque()

  def add(self, outputs) -> None:
    """Records one call's outputs (a pytree of arrays that are never donated later) and
    waits for the oldest recorded call while more than ``limit`` are recorded."""
    self._pending.append(outputs)
    while len(self._pending) > self.limit:
      jax.block_until_ready(self._pending.popleft())


@jax.jit
def _add_trees(a, b):
  """Leafwise ``a + b`` of two pytrees of the same structure, as one computation."""
  return jax.tree_util.tree_map(jnp.add, a, b)


# ----------------------------------------------------------------------------
# Data order.


def _host_rows(batch_size: int) -> slice:
  """The rows of a global batch this host feeds (all of them on one host)."""
  per_host = batch_size // jax.process_count()
  return slice(jax.process_index() * per_host, (jax.process_index() + 1) * per_host)


def batch_width(examples: Split, indices: np.ndarray, config) -> int:
  """Tokens per row of the global batch ``indices`` once padded: its longest example rounded
  up to the ``config.data.bucket`` (at most ``config.model.max_length``)."""
  longest = int(min(examples.lengths[indices].max(initial=0), config.model.max_length))
  return bucketed_length(longest, config.data.bucket, config.model.max_length)


def host_batch(examples: Split, indices: np.ndarray, config, valid=None) -> Batch:
  """This host's rows of the global batch ``indices`` (ints into ``examples``), padded to the
  global bucket (:func:`batch_width`); ``valid`` (bool, default all True) marks real rows.

  Returns:
    :func:`simpletron_jax.data.common.make_batch`'s numpy dict, ``[rows, width]`` inputs.
  """
  width = batch_width(examples, indices, config)
  rows = _host_rows(len(indices))
  batch = make_batch(examples, indices[rows], max_length=config.model.max_length,
                     bucket=config.data.bucket,
                     valid=None if valid is None else valid[rows])
  if batch["inputs"].shape[1] < width:  # another host's rows set the bucket
    pad = width - batch["inputs"].shape[1]
    for key in ("inputs", "mask", "inputs2", "mask2"):
      if key in batch:
        batch[key] = np.pad(batch[key], ((0, 0), (0, pad)))
  return batch


def train_batches(examples: Split, config: ml_collections.ConfigDict,
                  start_micro_step: int) -> Iterator[Batch]:
  """Endless, seeded, resumable stream of training micro-batches.

  The order is a pure function of ``config.seed``: a grain index dataset
  reshuffled every epoch, batched to ``batch_size / grad_accum_steps``
  examples. Micro-batch ``i`` is the same whether a run starts at 0 or
  resumes at ``i``. With ``config.data.group_by_length`` (default False) each
  epoch's permutation is grouped by length in pools of ``data.group_pool_batches``
  micro-batches (:mod:`simpletron_jax.data.grouping`), which cuts padding.

  Yields:
    Host-local batches (see :func:`simpletron_jax.data.common.make_batch`).
  """
  ds = train_index_batches(examples, config).map(
      lambda idx: host_batch(examples, np.asarray(idx), config))
  ds = ds[start_micro_step:]
  return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=8)))


def train_index_batches(examples: Split, config: ml_collections.ConfigDict) -> grain.MapDataset:
  """The example indices of every training micro-batch, as :func:`train_batches` reads them.

  Returns:
    An endless ``grain.MapDataset`` whose item ``i`` is micro-batch ``i``'s index array
    (``batch_size / grad_accum_steps`` int indices into ``examples``).

  Raises:
    ValueError: when the split has fewer examples than one micro-batch.
  """
  micro = config.batch_size // config.grad_accum_steps
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
  """The examples of a split once each, sorted by length so buckets stay tight.

  Args:
    examples: the split.
    config: the run config (``seed``, ``model.max_length``, ``data.bucket``).
    batch_size: global rows per batch.
    num_batches: at most this many batches; -1 or 0: the whole split. A limited
      evaluation reads a fixed random subset (drawn from ``config.seed``), so it is an
      unbiased estimate and the same examples at every validation.

  Yields:
    Host-local batches; the last one is completed with filler rows of weight 0.
  """
  for idx, valid in eval_index_batches(examples, config, batch_size, num_batches):
    yield host_batch(examples, idx, config, valid)


def eval_index_batches(examples: Split, config: ml_collections.ConfigDict, batch_size: int,
                       num_batches: int = -1) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """The ``(indices, valid)`` of each batch :func:`eval_batches` reads (same arguments).

  With ``config.data.drop_last_eval_batch`` (default False) the last ``len % batch_size``
  examples of the split, in its stored order, are left out, as LRA's
  ``batch(..., drop_remainder=True)`` does for image, Pathfinder and retrieval
  (``lra_benchmarks/image/input_pipeline.py``, ``matching/input_pipeline.py``); e.g. 10,000
  CIFAR-10 test images at batch 256 count 9,984. The count is LRA's; the examples left out
  are LRA's on image and Pathfinder when the split is in LRA's stored order, while on
  retrieval LRA drops a random remainder (its unseeded ``shuffle=True`` TSV reader).

  Yields:
    ``batch_size`` int indices into ``examples`` and a bool mask that is False for the
    filler rows completing the last batch.

  Raises:
    ValueError: naming ``data.drop_last_eval_batch`` when it is on and the split has fewer
      examples than one batch (nothing would be evaluated).
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
  batch_size = config.get("eval_batch_size") or config.batch_size // config.grad_accum_steps
  return -(-batch_size // (n_dev * jax.process_count())) * n_dev * jax.process_count()


def evaluate(p_eval_step, params_repl, examples: Split, config: ml_collections.ConfigDict,
             num_batches: int = -1) -> dict[str, float]:
  """Accuracy and mean loss over a split (or ``num_batches`` batches of it, see
  :func:`eval_batches`). At most :data:`CALLS_IN_FLIGHT` batches are unfinished at once
  (:class:`InFlightLimit`).

  Returns:
    ``{"accuracy", "loss", "count", "majority_rate"}``: count in examples, and
    majority_rate the share of the most frequent label among the examples read (by all
    hosts), the accuracy of always answering that label. Equal on every host.
  """
  n_dev = jax.local_device_count()
  batch_size = eval_batch_size(config)
  device_sums = None   # summed on the device; read once, after the last batch
  in_flight = InFlightLimit()
  label_counts: collections.Counter = collections.Counter()
  for batch in eval_batches(examples, config, batch_size, num_batches):
    sums = p_eval_step(params_repl, shard(batch, n_dev))
    device_sums = sums if device_sums is None else _add_trees(device_sums, sums)
    in_flight.add(device_sums)
    label_counts.update(batch["targets"][batch["weights"] > 0].tolist())
  totals = {"loss": 0.0, "correct": 0.0, "count": 0.0}
  if device_sums is not None:
    totals.update({k: float(v) for k, v in jax.device_get(unreplicate(device_sums)).items()})
  label_counts = distributed.sum_label_counts(label_counts)
  count = max(totals["count"], 1.0)
  read = sum(label_counts.values())
  return {"accuracy": totals["correct"] / count, "loss": totals["loss"] / count,
          "count": totals["count"],
          "majority_rate": max(label_counts.values()) / read if read else 0.0}


# ----------------------------------------------------------------------------
# Checkpoints.


def _ckpt_tree(state: TrainState) -> dict[str, Any]:
  """Step, params and optimizer state as host numpy arrays.

  Numpy, not jax arrays: on several hosts, orbax refuses the host-local arrays that
  ``pmap`` returns ("Cannot serialize host local jax.Array"), while numpy arrays are
  written once, by process 0, and read by every host (orbax ``NumpyHandler``).
  """
  return jax.device_get({"step": state.step, "params": state.params,
                         "opt_state": state.opt_state})


def checkpoint_manager(directory: str, max_to_keep: int | None) -> ocp.CheckpointManager:
  """An orbax manager keeping the newest ``max_to_keep`` checkpoints in ``directory``
  (None: all). Saves are synchronous, so a failed save raises in :func:`save_checkpoint`."""
  return ocp.CheckpointManager(
      os.path.abspath(directory),
      options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                           enable_async_checkpointing=False))


def model_config_dict(model_config) -> dict[str, Any]:
  """``config.model`` as the plain JSON dict that checkpoints record (references resolved)."""
  if isinstance(model_config, ml_collections.ConfigDict):
    model_config = model_config.to_dict()
  return json.loads(json.dumps(model_config))


def _step_dir(manager: ocp.CheckpointManager, step: int) -> str:
  return os.path.join(str(manager.directory), str(step))


def save_checkpoint(manager: ocp.CheckpointManager, step: int, state: TrainState,
                    meta: dict[str, Any]) -> None:
  """Saves the unreplicated ``state`` and a JSON ``meta`` dict at optimizer ``step``.

  ``meta`` is stored with ``state_crc32`` (:func:`run_guard.state_crc32` of the params and
  optimizer state) and ``state_structure`` (:func:`run_guard.state_structure`) added, which
  :func:`restore_checkpoint` verifies.

  Raises:
    run_guard.NonFiniteError: ``state`` holds NaN or inf; nothing is saved.
    run_guard.CheckpointError: naming the path and the reason, when the save fails (e.g. a
      read-only folder) or when orbax skips it because the folder already holds a step at
      or after ``step``.
  """
  tree = _ckpt_tree(state)
  where = _step_dir(manager, step)
  if not run_guard.tree_is_finite(tree):
    raise run_guard.NonFiniteError(f"refusing to save a state with NaN or inf to {where}")
  arrays = (tree["params"], tree["opt_state"])
  meta = {**meta, "state_crc32": run_guard.state_crc32(arrays),
          "state_structure": run_guard.state_structure(arrays)}
  try:
    saved = manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(tree),
                                                       meta=ocp.args.JsonSave(meta)))
    manager.wait_until_finished()
  except Exception as e:  # any failure of the library or the file system stops the run
    raise run_guard.CheckpointError(
        f"saving step {step} to {where} failed: {type(e).__name__}: {_first_line(e)}") from e
  if not saved:
    raise run_guard.CheckpointError(
        f"orbax skipped saving step {step} to {manager.directory}: the folder holds step "
        f"{manager.latest_step()}, and orbax only saves newer steps")


def _first_line(error: BaseException, limit: int = 300) -> str:
  text = str(error).strip().splitlines()
  return (text[0] if text else "")[:limit]


def _restore_verified(manager: ocp.CheckpointManager, state: TrainState, step: int,
                      model_config, resume_check=None) -> tuple[TrainState, dict[str, Any], int]:
  """Restores one step and checks its model config (or calls ``resume_check``), layout, CRC
  and finiteness (see :func:`restore_checkpoint`)."""
  where = _step_dir(manager, step)
  meta = dict(manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"])
  diff = []
  if model_config is not None and "model_config" in meta:
    diff = run_guard.flat_diff(models.with_option_defaults(meta["model_config"], saved=True),
                               models.with_option_defaults(model_config_dict(model_config)))
  if resume_check is not None:
    resume_check(where, meta, diff)
  elif diff:
    raise run_guard.ConfigMismatchError(
        f"{where} was saved with another model config: {'; '.join(diff)}. Resume with the "
        "checkpoint's values, or use another --workdir.")
  target = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, _ckpt_tree(state))
  structure = run_guard.state_structure((target["params"], target["opt_state"]))
  if meta.get("state_structure", structure) != structure:
    # Not damage: restoring would fail, and the checkpoint would be set aside as damaged.
    raise run_guard.ConfigMismatchError(
        f"{where} holds a train state of another layout: the parameter shapes (the task's "
        "vocabulary size and class count, model sizes) or the optimizer settings that change "
        "it (grad_accum_steps > 1, grad_clip_norm > 0, freeze, lora.rank) differ from the "
        "checkpoint's. Resume with the values in the workdir's config.json, or use another "
        "--workdir.")
  tree = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(target)))["state"]
  crc = run_guard.state_crc32((tree["params"], tree["opt_state"]))
  if "state_crc32" in meta and crc != meta["state_crc32"]:
    raise run_guard.CheckpointError("its arrays do not match the CRC-32 saved with them")
  if not run_guard.tree_is_finite(tree):
    raise run_guard.NonFiniteError("it holds NaN or inf")
  state = state.replace(step=tree["step"], params=tree["params"], opt_state=tree["opt_state"])
  return state, meta, step


def _quarantine(manager: ocp.CheckpointManager, step: int, quarantine_dir: str) -> str:
  """Moves a damaged step folder out of the manager's directory; returns its new path.

  Every host reads the same files and so finds the same damage; only process 0 moves the
  folder (a shared workdir), and the others wait for it before they reload.
  """
  target = os.path.join(quarantine_dir, f"{os.path.basename(str(manager.directory))}_{step}")
  if jax.process_index() == 0:
    os.makedirs(quarantine_dir, exist_ok=True)
    target += f"_{time.strftime('%Y%m%d-%H%M%S')}"
    shutil.move(_step_dir(manager, step), target)
  distributed.barrier(f"quarantine_{step}")
  manager.reload()
  return target


def restore_checkpoint(manager: ocp.CheckpointManager, state: TrainState,
                       step: int | None = None, model_config=None,
                       quarantine_dir: str | None = None,
                       resume_check: Callable[[str, dict, list[str]], None] | None = None
                       ) -> tuple[TrainState, dict[str, Any], int]:
  """Restores ``step`` (default: the newest intact one) into the structure of ``state``.

  A checkpoint is intact when its meta loads, its arrays load into ``state``'s structure,
  they match the CRC-32 saved with them (checkpoints that carry one) and they are finite.
  With ``step=None`` a checkpoint that is not intact is skipped with a
  :class:`run_guard.RunWarning` naming it, moved to ``quarantine_dir`` when given (so the
  run can save that step again), and the next older one is tried.

  Args:
    manager: the checkpoint folder.
    state: a TrainState giving the structure, shapes and dtypes.
    step: restore exactly this optimizer step (no fallback).
    model_config: ``config.model``; when given, a checkpoint saved with another model config
      is an error rather than a damaged checkpoint.
    quarantine_dir: where damaged checkpoints go; None: they stay.
    resume_check: called as ``resume_check(checkpoint folder, its meta, model_diff)`` before
      the arrays are read, in place of the ``model_config`` check (``model_diff`` lists the
      ``model.*`` differences as :func:`run_guard.flat_diff` lines); it raises
      :class:`run_guard.ConfigMismatchError` to refuse the checkpoint
      (:func:`train_and_evaluate` compares the whole run record there).

  Returns:
    ``(state, meta, step)``.

  Raises:
    FileNotFoundError: the folder holds no checkpoint, or not ``step``.
    run_guard.ConfigMismatchError: listing every ``model.*`` field that differs.
    run_guard.CheckpointError: ``step`` is damaged, or no checkpoint is intact (each one
      named with its problem).
  """
  available = sorted(manager.all_steps(), reverse=True)
  if not available or (step is not None and step not in available):
    raise FileNotFoundError(f"no checkpoint{'' if step is None else f' at step {step}'} in "
                            f"{manager.directory} (it holds steps {sorted(available)})")
  problems = []
  for candidate in ([step] if step is not None else available):
    try:
      return _restore_verified(manager, state, candidate, model_config, resume_check)
    except run_guard.ConfigMismatchError:
      raise
    except Exception as e:  # a damaged checkpoint fails in many ways; each is reported
      problem = f"{_step_dir(manager, candidate)}: {type(e).__name__}: {_first_line(e)}"
      if step is not None:
        raise run_guard.CheckpointError(f"damaged checkpoint {problem}") from e
      problems.append(problem)
      moved = _quarantine(manager, candidate, quarantine_dir) if quarantine_dir else None
      run_guard.warn(f"skipping damaged checkpoint {problem}"
                     + (f"; moved to {moved}" if moved else ""))
  raise run_guard.CheckpointError(f"no intact checkpoint in {manager.directory}: "
                                  + " | ".join(problems))


def _best_run_id(best: ocp.CheckpointManager, step: int) -> str | None:
  meta = best.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
  return meta.get("run_id")


def reconcile_best(best: ocp.CheckpointManager, meta: dict[str, Any], resume_step: int,
                   legacy: bool = False) -> dict[str, Any]:
  """Makes ``best/`` hold only checkpoints of this run's lineage, up to ``resume_step``.

  The lineage is ``meta["run_id"]`` (:func:`run_guard.lineage_id`): every checkpoint of a
  run, in ``checkpoints/`` and ``best/``, carries it. At start-up:

  * a ``best/`` step of another lineage is an error: ``best/`` never reports another run;
  * ``best/`` steps after ``resume_step`` were saved by this lineage after the checkpoint
    the run resumes from (at a fresh start, ``resume_step`` 0, by an earlier start killed
    before its first checkpoint, or kept after ``checkpoints/`` was deleted). They are
    removed with a warning; the run recomputes them;
  * a damaged ``best/`` step is removed with a warning;
  * if ``meta["best_step"]`` is then missing, the best so far is reset with a warning.

  Args:
    best: the ``best/`` manager (``max_to_keep=None``; :func:`prune_best` trims it).
    meta: the resumed checkpoint's meta, with ``run_id`` set.
    resume_step: the step the run resumes from (0: fresh start).
    legacy: the resumed checkpoint predates run ids; ``best/`` steps without one are kept.

  Returns:
    ``meta``, with ``best_val_accuracy`` and ``best_step`` reset if their checkpoint is gone.

  Raises:
    run_guard.CheckpointError: naming a ``best/`` step of another lineage.
  """
  for step in best.all_steps():
    where = _step_dir(best, step)
    try:
      run_id = _best_run_id(best, step)
    except Exception as e:  # unreadable meta: a damaged checkpoint
      run_guard.warn(f"removing damaged best checkpoint {where}: {_first_line(e)}")
      best.delete(step)
      continue
    if run_id != meta["run_id"] and not (legacy and run_id is None):
      raise run_guard.CheckpointError(
          f"{where} belongs to run {run_id}, not to this workdir's run {meta['run_id']}; "
          f"best/ must come from the run in checkpoints/. Move {best.directory} away or use "
          "another --workdir.")
    if step > resume_step:
      run_guard.warn(f"removing {where}: saved after step {resume_step}, where this run "
                     "(re)starts; it will be recomputed")
      best.delete(step)
  best.reload()
  if meta["best_step"] >= 0 and meta["best_step"] not in best.all_steps():
    run_guard.warn(f"the best checkpoint of step {meta['best_step']} is missing from "
                   f"{best.directory}; the best validation restarts from this run's next one")
    meta.update(best_val_accuracy=-1.0, best_step=-1)
  return meta


def prune_best(best: ocp.CheckpointManager, keep_step: int) -> None:
  """Deletes every ``best/`` step but ``keep_step``; call after a regular checkpoint."""
  for step in best.all_steps():
    if step != keep_step:
      best.delete(step)


# ----------------------------------------------------------------------------
# The loop.


def check_finite(unchecked: list, state_repl: TrainState, last_good: str) -> None:
  """Stops a run whose training went non-finite, before anything is logged or saved.

  Args:
    unchecked: ``(optimizer step, metrics)`` of the micro-steps since the last check, as
      returned by the pmapped train step (``loss`` sums and ``grad_norm``).
    state_repl: the replicated state after the last of them.
    last_good: the newest checkpoint saved, for the message.

  Raises:
    run_guard.NonFiniteError: naming the first step whose loss or gradient norm is NaN or
      inf (or the last step, when only the parameters are), and ``last_good``.
  """
  bad = run_guard.first_nonfinite(jax.device_get(unchecked))
  if bad is None and not run_guard.tree_is_finite(unreplicate(state_repl.params)):
    bad = (unchecked[-1][0] if unchecked else -1, {"params": float("nan")})
  if bad is not None:
    step, values = bad
    shown = ", ".join(f"{k} {v}" for k, v in values.items())
    raise run_guard.NonFiniteError(
        f"step {step}: training became non-finite ({shown}). The run stopped without saving "
        f"this state; the last good checkpoint is {last_good}. Lower learning_rate, raise "
        "warmup or set grad_clip_norm, then resume or start a new workdir.")


def build_model(config: ml_collections.ConfigDict, data: tasks.TaskData):
  """The classifier for ``config.model`` sized to ``data``."""
  return models.build_classifier(config.model, vocab_size=data.vocab_size,
                                 num_classes=data.num_classes,
                                 dual=isinstance(data.train, PairedExamples))


def apply_init_from(config: ml_collections.ConfigDict, state: TrainState,
                    workdir: str) -> TrainState:
  """Starts ``state`` from ``config.init_from``'s best checkpoint (weight surgery).

  Copies every parameter whose path and shape the source run shares with this model (only
  those matching ``config.init_include`` when set; :func:`transfer.transfer_params`) and
  writes what was copied, newly initialised and dropped to ``workdir/transfer.json``.

  Returns:
    ``state`` unchanged when ``config.init_from`` is empty, else with the new params.

  Raises:
    FileNotFoundError, ValueError: see :func:`transfer.init_from_config`.
    run_guard.WriteError: ``transfer.json`` could not be written (named).
  """
  params, report = transfer.init_from_config(config, state.params)
  if report is None:
    return state
  print(f"init_from {config.init_from}: {report.summary()}", file=sys.stderr)
  if jax.process_index() == 0:
    run_guard.write_json_atomic(os.path.join(workdir, "transfer.json"),
                                {"init_from": config.init_from, **report.to_dict()})
  return state.replace(params=params)


def make_workdir(workdir: str) -> None:
  """Creates ``workdir`` (and its parents) unless it exists as a folder.

  Raises:
    NotADirectoryError: ``workdir`` (or a folder on its path) is a file; names it.
    OSError: of the same type, naming ``workdir``, when it cannot be created (permissions).
  """
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise NotADirectoryError(f"--workdir {workdir!r} is a file, not a folder: pass a folder "
                             "(created if missing) or move the file away")
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise type(e)(f"--workdir {workdir!r} cannot be created: {e.strerror or e} "
                  f"({e.filename or workdir}); pass a folder in a writable place") from e


def read_config_json(path: str) -> dict[str, Any] | None:
  """The config a run saved at ``path`` as a nested dict (with its ``config_history``), or
  None when the file is missing or unreadable (a torn write: it is rewritten at start)."""
  try:
    with open(path, encoding="utf-8") as f:
      tree = json.load(f)
  except (OSError, ValueError):
    return None
  return tree if isinstance(tree, dict) else None


def config_with_history(config: ml_collections.ConfigDict, history: list,
                        changes: list[dict[str, Any]], step: int) -> dict[str, Any]:
  """``config`` as the nested dict of ``config.json``, with its history of changes.

  Args:
    config: this start's config.
    history: the ``config_history`` of the previous ``config.json`` (a list, maybe empty).
    changes: :func:`run_guard.check_resume`'s changes at this start (empty: none).
    step: the optimizer step this start resumes from.

  Returns:
    The config's fields, plus under :data:`run_guard.CONFIG_HISTORY_KEY` (when any start
    changed a setting) one entry per such start: ``{"step", "time"`` (ISO 8601, local),
    ``"changes": {field: {"old", "new", "allowed"}}, "forced"`` (True when a change that
    alters what is computed was let through by ``--allow_resume_changes``)``}``.
  """
  tree = json.loads(config.to_json_best_effort())
  history = list(history) if isinstance(history, list) else []
  if changes:
    entry = {"step": int(step), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
             "changes": {c["field"]: {"old": c["old"], "new": c["new"],
                                      "allowed": c["allowed"]} for c in changes},
             "forced": any(not c["allowed"] for c in changes)}
    last = history[-1] if history else {}
    if not (last.get("step") == entry["step"] and last.get("changes") == entry["changes"]):
      history.append(entry)   # a start killed before its first save repeats the same change
  if history:
    tree[run_guard.CONFIG_HISTORY_KEY] = history
  return tree


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       step_hook: Callable[[int], None] | None = None,
                       data: tasks.TaskData | None = None,
                       precompile_workers: int = 0,
                       allow_resume_changes: bool = False) -> dict[str, Any]:
  """Trains, evaluates every ``eval_frequency`` steps, then tests the final and best parameters.

  Resumes from the newest checkpoint in ``workdir/checkpoints`` if there is
  one, and continues exactly as an uninterrupted run would (same data order,
  dropout keys and optimizer state). Writes ``workdir/metrics.jsonl``,
  TensorBoard events in ``workdir/tb``, ``workdir/config.json`` and, at the
  end, ``workdir/results.json``.

  Before any work every field is validated (:func:`validate_config`,
  :func:`run_guard.check_settings`), and truncation by ``model.max_length`` is reported once
  per split. A resumed checkpoint must have been computed with this config's settings, data,
  vocabulary and class count, and device and host counts (:func:`run_guard.check_resume`;
  the checkpoint meta holds them as ``run_record``); the changes let through
  (:data:`run_guard.RESUME_ALLOWED_FIELDS`, or any but ``model.*`` with
  ``allow_resume_changes``) are appended to ``config.json``'s ``config_history`` (see
  :func:`config_with_history`) instead of being overwritten. A checkpoint saved before run
  records resumes with a warning, compared with the previous ``config.json`` only.

  Args:
    config: the run config (see ``configs/``).
    workdir: output directory; created if missing.
    step_hook: called with the optimizer step after each step and its
      checkpoint (tests use it to simulate a kill).
    data: preloaded task data; loaded from ``config`` when None.
    precompile_workers: if > 0, the train and eval steps of every batch shape the run will
      meet are compiled before the loop, in this many threads side by side
      (:mod:`simpletron_jax.precompile`); 0 compiles each shape when the loop first meets it.
    allow_resume_changes: resume even though settings that change what is computed differ
      from the checkpoint's (train.py ``--allow_resume_changes``); the changes are recorded
      in ``config.json``'s ``config_history``. ``model.*`` changes stay refused.

  Returns:
    The contents of ``results.json``: test accuracy and loss under two protocols,
    ``test_{accuracy,loss}_best_val`` for the best-validation checkpoint (its step
    ``best_step``, its ``best_val_accuracy``; SimpleTRON's protocol; also kept as
    ``test_accuracy``/``test_loss``) and ``test_{accuracy,loss}_final`` for the
    parameters after ``final_step`` (LRA's ``--test_only`` protocol), the
    majority-class rates of the val and test examples evaluated, steps/s and wall time in
    seconds, the seconds the loop spent compiling train steps (one per batch shape met that
    had no program yet, ``train_shapes_compiled_in_loop``), and with ``precompile_workers``
    the ``precompile_seconds`` and counts of :func:`precompile.precompile_steps`. Each train
    record of ``metrics.jsonl`` has ``compile_seconds`` and ``new_shapes`` of its window and
    ``steps_per_sec_excluding_compile``. ``final_step``, ``complete`` (False when
    ``max_train_minutes`` stopped the run before ``num_train_steps``, with ``stopped_by``)
    and ``config_fingerprint`` (:func:`run_guard.config_fingerprint`) say what the numbers
    describe; a run that trains on past an existing ``results.json`` deletes it first.

  Faults are never silent (docs/faults.md, "When things go wrong"): ``workdir/run.lock`` keeps a
  second run out; a checkpoint that fails verification is moved to ``workdir/damaged`` and
  the run resumes from the newest intact one; ``best/`` only ever holds checkpoints of this
  run's lineage (``workdir/run_id``, see :func:`reconcile_best`); ``results.json`` and
  ``metrics.jsonl`` are strict JSON (non-finite values are ``null``).

  Raises:
    ValueError: for an inconsistent config (see :func:`validate_config` and
      :func:`run_guard.check_settings`) or an empty split (:func:`run_guard.check_splits`).
    run_guard.WorkdirLockedError: another run holds the workdir.
    run_guard.NonFiniteError: a loss, gradient norm or parameter became NaN or inf.
    run_guard.CheckpointError: a save failed, no checkpoint is intact, or ``best/`` holds
      another run's checkpoint.
    run_guard.ConfigMismatchError: the checkpoint resumed was computed with other settings:
      ``model.*``, or without ``allow_resume_changes`` any field outside
      :data:`run_guard.RESUME_ALLOWED_FIELDS`, the task data's vocabulary size, class count
      or contents, or the device or host count (:func:`run_guard.check_resume`).
    NotADirectoryError: ``workdir`` is a file (:func:`make_workdir`).
    run_guard.PreemptedError: SIGTERM or SIGINT came during the loop
      (:class:`run_guard.PreemptionGuard`; every host stops at the same step): that step was
      finished, logged and saved and the lock released; no test, no ``results.json``.
    run_guard.WriteError: ``metrics.jsonl``, the TensorBoard file, ``results.json`` or
      ``transfer.json`` could not be written (named; a failed checkpoint save is a
      ``CheckpointError``).
  """
  if precompile_workers < 0:
    raise ValueError(f"--precompile_workers={precompile_workers} must be >= 0 (0: off)")
  wall_start = time.time()
  n_dev = jax.local_device_count()
  validate_config(config, jax.device_count(), jax.process_count())
  run_guard.check_settings(config)
  make_workdir(workdir)
  lock = run_guard.acquire_lock(workdir) if jax.process_index() == 0 else None
  data = data or tasks.load_task(config)
  distributed.check_hosts_agree(config, data)  # every host: process 0's config and data
  run_guard.check_splits(data, config)
  if jax.process_index() == 0:   # loaders that truncate while loading report there
    for name in ("train", "val", "test"):
      report_split_truncation(name, getattr(data, name), int(config.model.max_length))
  model = build_model(config, data)

  init_rng, dropout_root = jax.random.split(jax.random.PRNGKey(int(config.seed)))
  state = create_train_state(config, model, init_rng)
  ckpts = checkpoint_manager(os.path.join(workdir, "checkpoints"), config.max_to_keep)
  best_ckpts = checkpoint_manager(os.path.join(workdir, "best"), None)  # see prune_best
  distributed.check_same_checkpoints(ckpts.all_steps(), str(ckpts.directory))
  meta = {"best_val_accuracy": -1.0, "best_step": -1, "train_seconds": 0.0}
  start_step = 0
  config_path = os.path.join(workdir, "config.json")
  previous_config = read_config_json(config_path)   # before this start overwrites it
  record = run_guard.run_record(config, vocab_size=data.vocab_size,
                                num_classes=data.num_classes, num_devices=jax.device_count(),
                                num_hosts=jax.process_count(),
                                data_sha256=distributed.data_fingerprint(data))
  changes = []   # this start's changes from the checkpoint's settings (config history)

  def resume_check(where: str, saved_meta: dict, model_diff: list[str]) -> None:
    saved = saved_meta.get(run_guard.RECORD_KEY)
    if saved is None:   # saved before run records existed
      run_guard.warn(f"{where} predates run records: only its model config"
                     f"{' and ' + config_path if previous_config else ''} can be compared "
                     "with this config; the device count and the data cannot")
      saved = {"config": previous_config} if previous_config else None
    changes[:] = run_guard.check_resume(where, saved, record, model_diff=model_diff,
                                        allow_changes=allow_resume_changes)

  if ckpts.all_steps():
    state, meta, start_step = restore_checkpoint(
        ckpts, state, model_config=config.model, quarantine_dir=os.path.join(workdir, "damaged"),
        resume_check=resume_check)
    print(f"Resumed from {workdir}/checkpoints at step {start_step}", file=sys.stderr)
    if changes:
      print(f"Settings changed since the checkpoint (recorded in {config_path}): "
            + "; ".join(run_guard.describe_change(c) for c in changes), file=sys.stderr)
  else:
    state = apply_init_from(config, state, workdir)
  legacy = start_step > 0 and "run_id" not in meta  # saved before run ids existed
  meta.update(run_id=run_guard.lineage_id(workdir, meta.get("run_id")),
              model_config=model_config_dict(config.model), **{run_guard.RECORD_KEY: record})
  meta = reconcile_best(best_ckpts, meta, start_step, legacy)
  last_good = _step_dir(ckpts, start_step) if start_step else "none (nothing saved yet)"
  accum = config.grad_accum_steps
  if jax.process_index() == 0:
    run_guard.write_json_atomic(config_path, config_with_history(
        config, (previous_config or {}).get(run_guard.CONFIG_HISTORY_KEY, []), changes,
        start_step))
  logger = None
  results_path = os.path.join(workdir, "results.json")
  guard = run_guard.PreemptionGuard()   # SIGTERM/SIGINT: save and stop after the step
  preempted = False
  try:
    logger = MetricLogger(workdir, resume_step=start_step, enabled=jax.process_index() == 0)
    if (jax.process_index() == 0 and start_step < config.num_train_steps
        and os.path.exists(results_path)):   # it would no longer describe the workdir
      try:
        os.remove(results_path)
      except OSError as e:
        raise run_guard.WriteError(
            f"could not remove {results_path}, the results of an earlier run that this one "
            f"trains past (from step {start_step}): {e.strerror or e}. Delete it, then rerun "
            "the same command.") from e
      print(f"removed {results_path} of an earlier run; it is written again when this run "
            "ends", file=sys.stderr)
    logger.write(start_step,
                 {"params": sum(x.size for x in jax.tree_util.tree_leaves(state.params))}, "info")

    p_train, p_eval = pmap_steps(state.apply_fn)
    state_repl = replicate(state)
    schedule = make_schedule(config)
    train_programs, eval_fn, precompiled = {}, p_eval, {}   # {batch_shape_key: program}
    if precompile_workers:
      from simpletron_jax import precompile  # pylint: disable=import-outside-toplevel  (a cycle)
      train_steps, eval_fn, precompiled = precompile.precompile_steps(
          p_train, p_eval, state_repl, data, config, start_step * accum, precompile_workers)
      logger.write(start_step, precompiled, "info")
      print(f"precompiled {precompiled['precompiled_train_shapes']} train and "
            f"{precompiled['precompiled_eval_shapes']} eval step shapes in "
            f"{precompiled['precompile_seconds']:.1f} s ({precompile_workers} threads)",
            file=sys.stderr)
      train_programs = train_steps.compiled
    batches = train_batches(data.train, config, start_step * accum)
    in_flight = InFlightLimit()   # the host runs at most a few micro-steps ahead
    window = {"loss": 0.0, "correct": 0.0, "count": 0.0}
    window_sums, window_steps = [], 0
    unchecked = []        # (step, metrics) of the micro-steps since the last finiteness check
    window_start, window_excluded = time.time(), 0.0
    # Each new batch shape (a length bucket) compiles its own step inside p_train's call; that
    # call's time is logged as compile_seconds, and steps/s is also given without it.
    seen_shapes = set(train_programs)   # precompiled shapes count as seen
    window_compile_s, window_new_shapes, compile_s_this_run, loop_shapes = 0.0, 0, 0.0, 0
    val_majority = None   # majority rate of the examples the last validation read
    train_seconds = float(meta["train_seconds"])
    bar = tqdm.tqdm(total=config.num_train_steps, initial=start_step, desc="train",
                    dynamic_ncols=True, mininterval=1.0 if sys.stderr.isatty() else 30.0,
                    disable=jax.process_index() != 0)
    budget_s = 60.0 * float(config.get("max_train_minutes", 0) or 0)
    last_step = config.num_train_steps
    guard.install()
    for step in range(start_step + 1, config.num_train_steps + 1):
      for a in range(accum):
        batch = shard(next(batches), n_dev)
        rng = jax.random.fold_in(dropout_root, (step - 1) * accum + a)
        shapes = batch_shape_key(batch)
        step_fn = train_programs.get(shapes, p_train)
        if shapes in seen_shapes:
          state_repl, sums = step_fn(state_repl, batch, rng)
        else:   # drain the queue first, so the call's time is the compile's alone
          jax.block_until_ready(state_repl)
          call_start = time.time()
          state_repl, sums = step_fn(state_repl, batch, rng)
          seen_shapes.add(shapes)
          window_compile_s += time.time() - call_start
          window_new_shapes += 1
          loop_shapes += 1
        window_sums.append(sums)
        unchecked.append((step, sums))
        in_flight.add(sums)
      window_steps += 1
      bar.update(1)
      out_of_time = bool(budget_s) and distributed.agree_on_flag(
          time.time() - wall_start > budget_s)
      final = step == config.num_train_steps or out_of_time
      preempted = guard.should_stop(step)   # every host at the same step
      stop = final or preempted   # log and save; only `final` validates (as a straight run)

      if stop or not (step % config.log_every and step % config.eval_frequency
                      and step % config.checkpoint_every):
        check_finite(unchecked, state_repl, last_good)  # before anything is logged or saved
        unchecked = []
      if step % config.log_every == 0 or stop:
        for sums in jax.device_get(window_sums):
          for k in window:
            window[k] += float(sums[k][0])
        elapsed = max(time.time() - window_start - window_excluded, 1e-9)
        train_seconds += elapsed
        count = max(window["count"], 1.0)
        logger.write(step, {"loss": window["loss"] / count, "accuracy": window["correct"] / count,
                            "learning_rate": float(schedule(step - 1)),
                            "steps_per_sec": window_steps / elapsed,
                            "steps_per_sec_excluding_compile":
                                window_steps / max(elapsed - window_compile_s, 1e-9),
                            "compile_seconds": window_compile_s,
                            "new_shapes": window_new_shapes}, "train")
        bar.set_postfix(loss=f"{window['loss'] / count:.3f}",
                        acc=f"{window['correct'] / count:.3f}")
        window = dict.fromkeys(window, 0.0)
        window_sums, window_steps = [], 0
        window_start, window_excluded = time.time(), 0.0
        compile_s_this_run += window_compile_s
        window_compile_s, window_new_shapes = 0.0, 0

      pause_start = time.time()
      if step % config.eval_frequency == 0 or final:
        val = evaluate(eval_fn, state_repl.params, data.val, config,
                       config.get("num_eval_steps", -1))
        logger.write(step, val, "val")
        if not math.isfinite(val["loss"]):
          raise run_guard.NonFiniteError(
              f"step {step}: the validation loss is {val['loss']}; the run stopped without "
              f"saving this state. The last good checkpoint is {last_good}.")
        val_majority = val["majority_rate"]
        bar.write(f"step {step}: val accuracy {val['accuracy']:.4f} loss {val['loss']:.4f}")
        if val["accuracy"] > meta["best_val_accuracy"]:
          meta.update(best_val_accuracy=val["accuracy"], best_step=step)
          save_checkpoint(best_ckpts, step, unreplicate(state_repl), meta)

      if step % config.checkpoint_every == 0 or stop:
        meta["train_seconds"] = train_seconds
        save_checkpoint(ckpts, step, unreplicate(state_repl), meta)
        last_good = _step_dir(ckpts, step)
        prune_best(best_ckpts, meta["best_step"])
      if step_hook is not None:
        ckpts.wait_until_finished()
        best_ckpts.wait_until_finished()
        step_hook(step)
      window_excluded += time.time() - pause_start
      if preempted:
        last_step = step
        break
      if out_of_time:
        last_step = step
        bar.write(f"max_train_minutes={config.max_train_minutes} reached after step {step}; "
                  "rerun with the same workdir to continue")
        break
    guard.restore()   # from here on, a signal ends the process: the last step is saved
    bar.close()
    ckpts.wait_until_finished()
    best_ckpts.wait_until_finished()
    if guard.requested_locally() and not preempted:   # it came after the last step's check
      preempted = True
    if preempted:   # no test: the scheduler's grace period is short
      bar.write(f"{guard.cause}: saved step {last_step} to {last_good}")
      logger.close()
      raise run_guard.PreemptedError(last_step, guard.cause)

    # Two protocols: the final parameters (LRA's --test_only) and the best-validation
    # checkpoint (SimpleTRON's); the two coincide when the last validation was the best.
    test_limit = config.get("num_test_steps", -1)
    final_test = evaluate(eval_fn, state_repl.params, data.test, config, test_limit)
    logger.write(last_step, final_test, "test_final")
    best_state, best_meta, best_step = restore_checkpoint(
        best_ckpts, state, step=meta["best_step"], model_config=config.model)
    test = final_test if best_step == last_step else evaluate(
        eval_fn, replicate(best_state.params), data.test, config, test_limit)
    logger.write(best_step, test, "test")
    complete = last_step >= config.num_train_steps
    results = {
        "task": config.task, "attention": config.model.attention,
        "test_accuracy": test["accuracy"], "test_loss": test["loss"],
        "test_accuracy_best_val": test["accuracy"], "test_loss_best_val": test["loss"],
        "test_accuracy_final": final_test["accuracy"], "test_loss_final": final_test["loss"],
        "final_step": last_step,
        "test_majority_rate": test["majority_rate"],
        "val_majority_rate": (val_majority if val_majority is not None
                              else data.val.majority_rate()),
        "best_step": best_step, "best_val_accuracy": best_meta["best_val_accuracy"],
        "num_train_steps": config.num_train_steps, "last_step": last_step,
        "complete": complete, "stopped_by": None if complete else "max_train_minutes",
        "config_fingerprint": run_guard.config_fingerprint(config),
        "steps_per_sec": last_step / max(train_seconds, 1e-9),
        "train_seconds": train_seconds,
        "train_compile_seconds_this_run": compile_s_this_run,
        "train_shapes_compiled_in_loop": loop_shapes,
        **precompiled,
        "wall_seconds_this_run": time.time() - wall_start,
        "num_devices": jax.device_count(), "data_source": data.source,
    }
    if jax.process_index() == 0:
      run_guard.write_json_atomic(results_path, results)   # never a half-written file
    logger.close()
    return results
  finally:   # also on errors and preemption: no handler, open file or lock is left behind
    guard.restore()
    try:
      if logger is not None:
        logger.close()   # a no-op after a success; after an error, its own would hide the first
    except run_guard.WriteError:
      pass
    run_guard.release_lock(lock)


def load_run_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a run saved in ``workdir/config.json``.

  Raises:
    FileNotFoundError: if the file is missing (not a train.py workdir).
    ValueError: if it is not a JSON object.
  """
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: is {workdir!r} a train.py workdir? "
                            "Pass --config to evaluate with an explicit config.")
  tree = read_config_json(path)
  if tree is None:
    raise ValueError(f"{path} is not a JSON object (damaged?); pass --config to evaluate "
                     "with an explicit config")
  tree.pop(run_guard.CONFIG_HISTORY_KEY, None)
  return ml_collections.ConfigDict(tree)


def evaluate_checkpoint(workdir: str, split: str = "test", which: str = "best",
                        step: int | None = None,
                        config: ml_collections.ConfigDict | None = None,
                        precompile_workers: int = 0) -> dict[str, Any]:
  """Restores a checkpoint of ``workdir`` and evaluates it on ``split``.

  Args:
    workdir: a train.py run directory.
    split: ``"train"``, ``"val"`` or ``"test"``.
    which: ``"best"`` (the best-validation checkpoint) or ``"latest"``.
    step: restore this optimizer step from ``workdir/checkpoints`` instead.
    config: overrides the run's saved config.
    precompile_workers: if > 0, the eval step of every batch shape the split meets is
      compiled first, in this many threads side by side (:mod:`simpletron_jax.precompile`).

  Returns:
    ``{"accuracy", "loss", "count", "step", "split", "checkpoint"}``.

  Raises:
    FileNotFoundError: when the workdir (which is never created), its checkpoint folder,
      the checkpoint or its config is missing.
    ValueError: for an unknown split or ``which``, or ``precompile_workers < 0``.
  """
  if split not in ("train", "val", "test") or which not in ("best", "latest"):
    raise ValueError(f"split={split!r} / which={which!r} not understood")
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f"--workdir {workdir!r} is not a folder: pass the workdir of a "
                            "train.py run")
  config = config or load_run_config(workdir)
  sub = "best" if which == "best" and step is None else "checkpoints"
  if not os.path.isdir(os.path.join(workdir, sub)):
    raise FileNotFoundError(f"{os.path.join(workdir, sub)} not found: the run saved no "
                            f"{'best-validation ' if sub == 'best' else ''}checkpoint yet")
  data = tasks.load_task(config)
  report_split_truncation(split, getattr(data, split), int(config.model.max_length))
  model = build_model(config, data)
  state = create_train_state(config, model, jax.random.PRNGKey(0))
  manager = checkpoint_manager(os.path.join(workdir, sub), config.max_to_keep)
  state, _, restored_step = restore_checkpoint(manager, state, step, model_config=config.model)
  if precompile_workers < 0:
    raise ValueError(f"--precompile_workers={precompile_workers} must be >= 0 (0: off)")
  _, p_eval = pmap_steps(state.apply_fn)
  limit = config.get("num_test_steps", -1) if split == "test" else config.get("num_eval_steps", -1)
  params_repl = replicate(state.params)
  if precompile_workers:
    from simpletron_jax import precompile  # pylint: disable=import-outside-toplevel  (a cycle)
    start = time.time()
    p_eval = precompile.precompile_eval_step(p_eval, params_repl,
                                             [(getattr(data, split), limit)], config,
                                             precompile_workers)
    print(f"precompiled {len(p_eval.compiled)} eval step shapes in "
          f"{time.time() - start:.1f} s ({precompile_workers} threads)", file=sys.stderr)
  metrics = evaluate(p_eval, params_repl, getattr(data, split), config, limit)
  return {**metrics, "step": restored_step, "split": split,
          "checkpoint": os.path.join(workdir, sub)}
