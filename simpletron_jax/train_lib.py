"""Training and evaluation: optimizer, pmapped steps, data order, checkpoints, the loop.

The recipe follows LRA ``utils/train_utils.py`` and ``listops/train.py``
(Tay et al., 2020), with these changes: optax AdamW instead of flax.optim,
seeded data order, batches padded to a length bucket instead of to
``max_length``, metrics as sums over real examples, orbax checkpoints that a
killed run resumes from, and a test evaluation of the best-validation
checkpoint.

Units: a *step* is one optimizer update on ``config.batch_size`` examples; with
``config.grad_accum_steps = A`` it is made of A *micro-steps* of
``batch_size / A`` examples each (``optax.MultiSteps``).
"""

from __future__ import annotations

import collections
import json
import math
import os
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

from simpletron_jax import models, schedules, tasks
from simpletron_jax.data.common import PairedExamples, Split, bucketed_length, make_batch
from simpletron_jax.metric_logging import MetricLogger

AXIS = "batch"
Batch = dict[str, np.ndarray]


class TrainState(train_state.TrainState):
  """flax TrainState; ``step`` counts micro-steps (see the module docstring)."""


# ----------------------------------------------------------------------------
# Config checks, optimizer, state.


def validate_config(config: ml_collections.ConfigDict, n_devices: int) -> None:
  """Checks the training fields of ``config`` against the device count.

  Raises:
    ValueError: naming the field: ``batch_size`` not divisible by
      ``grad_accum_steps`` times the global device count, non-positive step
      counts, or any ``model.*`` problem found by
      :func:`simpletron_jax.models.validate_model_config`.
  """
  models.validate_model_config(config.model)
  if config.grad_accum_steps < 1:
    raise ValueError(f"grad_accum_steps={config.grad_accum_steps} must be >= 1")
  if config.batch_size % (config.grad_accum_steps * n_devices):
    raise ValueError(
        f"batch_size={config.batch_size} must be divisible by grad_accum_steps="
        f"{config.grad_accum_steps} times the {n_devices} device(s)")
  for field in ("num_train_steps", "eval_frequency", "checkpoint_every", "log_every"):
    if config[field] <= 0:
      raise ValueError(f"{field}={config[field]} must be positive")


def make_schedule(config: ml_collections.ConfigDict) -> Callable:
  """The learning-rate schedule of ``config`` (steps are optimizer updates)."""
  return schedules.create_learning_rate_schedule(
      factors=config.factors, base_learning_rate=config.learning_rate,
      warmup_steps=config.warmup, steps_per_cycle=config.num_train_steps)


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """AdamW with LRA's decoupled decay ``p -= lr * wd * p`` on every parameter.

  Preceded by global-norm gradient clipping when ``config.grad_clip_norm > 0`` (LRA's
  Path-X recipe), and wrapped in ``optax.MultiSteps`` when ``config.grad_accum_steps > 1``,
  so the schedule advances once per optimizer update.
  """
  tx = optax.adamw(make_schedule(config), b1=config.adam_b1, b2=config.adam_b2,
                   eps=config.adam_eps, weight_decay=config.weight_decay)
  clip = float(config.get("grad_clip_norm", 0.0) or 0.0)
  if clip > 0:
    tx = optax.chain(optax.clip_by_global_norm(clip), tx)
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
    A TrainState at step 0.
  """
  length = min(config.model.max_length, 16)
  tokens = jnp.ones((1, length), jnp.int32)
  second = (tokens, None) if isinstance(model, models.DualEncoderClassifier) else ()
  params = jax.jit(lambda r: model.init({"params": r}, tokens, None, *second,
                                        deterministic=True))(rng)
  return TrainState.create(apply_fn=model.apply, params=params["params"],
                           tx=make_optimizer(config))


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
    ``(new_state, metric sums over the global micro-batch)``.
  """
  dropout_rng = jax.random.fold_in(dropout_rng, jax.lax.axis_index(AXIS))
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  (_, sums), grads = grad_fn(state.params, state.apply_fn, batch, dropout_rng, False)
  grads = jax.lax.pmean(grads, AXIS)
  return state.apply_gradients(grads=grads), jax.lax.psum(sums, AXIS)


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


def unreplicate(tree):
  """The first device's copy of every leaf of a pmapped (``[n_devices, ...]``) tree."""
  return jax.tree_util.tree_map(lambda x: x[0], tree)


def shard(batch: Batch, n_devices: int) -> Batch:
  """Reshapes every ``[B, ...]`` array to ``[n_devices, B / n_devices, ...]``."""
  return {k: v.reshape(n_devices, -1, *v.shape[1:]) for k, v in batch.items()}


# ----------------------------------------------------------------------------
# Data order.


def _host_rows(batch_size: int) -> slice:
  """The rows of a global batch this host feeds (all of them on one host)."""
  per_host = batch_size // jax.process_count()
  return slice(jax.process_index() * per_host, (jax.process_index() + 1) * per_host)


def _host_batch(examples: Split, indices: np.ndarray, config, valid=None) -> Batch:
  """This host's rows of the global batch ``indices``, padded to the global bucket."""
  longest = int(min(examples.lengths[indices].max(initial=0), config.model.max_length))
  width = bucketed_length(longest, config.data.bucket, config.model.max_length)
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
  resumes at ``i``.

  Yields:
    Host-local batches (see :func:`simpletron_jax.data.common.make_batch`).
  """
  micro = config.batch_size // config.grad_accum_steps
  if len(examples) < micro:
    raise ValueError(f"the training split has {len(examples)} examples, fewer than one "
                     f"micro-batch of {micro} (config fields batch_size, grad_accum_steps)")
  ds = (grain.MapDataset.range(len(examples)).shuffle(seed=int(config.seed)).repeat()
        .batch(micro, drop_remainder=True)
        .map(lambda idx: _host_batch(examples, np.asarray(idx), config)))
  ds = ds[start_micro_step:]
  return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=8)))


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
  order = np.arange(len(examples))
  n_batches = math.ceil(len(order) / batch_size)
  if num_batches and 0 < num_batches < n_batches:
    n_batches = num_batches
    order = np.random.default_rng(int(config.seed)).permutation(order)[:n_batches * batch_size]
  order = order[np.argsort(examples.lengths[order], kind="stable")]
  for b in range(n_batches):
    idx = order[b * batch_size:(b + 1) * batch_size]
    valid = np.ones(batch_size, bool)
    valid[len(idx):] = False
    idx = np.concatenate([idx, np.full(batch_size - len(idx), order[0])])
    yield _host_batch(examples, idx, config, valid)


def evaluate(p_eval_step, params_repl, examples: Split, config: ml_collections.ConfigDict,
             num_batches: int = -1) -> dict[str, float]:
  """Accuracy and mean loss over a split (or ``num_batches`` batches of it, see
  :func:`eval_batches`).

  Returns:
    ``{"accuracy", "loss", "count", "majority_rate"}``: count in examples, and
    majority_rate the share of the most frequent label among the examples read (this host's
    rows), the accuracy of always answering that label.
  """
  n_dev = jax.local_device_count()
  batch_size = config.get("eval_batch_size") or config.batch_size // config.grad_accum_steps
  batch_size = -(-batch_size // (n_dev * jax.process_count())) * n_dev * jax.process_count()
  totals = {"loss": 0.0, "correct": 0.0, "count": 0.0}
  label_counts: collections.Counter = collections.Counter()
  for batch in eval_batches(examples, config, batch_size, num_batches):
    sums = p_eval_step(params_repl, shard(batch, n_dev))
    for k, v in jax.device_get(unreplicate(sums)).items():
      totals[k] += float(v)
    label_counts.update(batch["targets"][batch["weights"] > 0].tolist())
  count = max(totals["count"], 1.0)
  read = sum(label_counts.values())
  return {"accuracy": totals["correct"] / count, "loss": totals["loss"] / count,
          "count": totals["count"],
          "majority_rate": max(label_counts.values()) / read if read else 0.0}


# ----------------------------------------------------------------------------
# Checkpoints.


def _ckpt_tree(state: TrainState) -> dict[str, Any]:
  return {"step": state.step, "params": state.params, "opt_state": state.opt_state}


def checkpoint_manager(directory: str, max_to_keep: int) -> ocp.CheckpointManager:
  """An orbax manager keeping the newest ``max_to_keep`` checkpoints in ``directory``."""
  return ocp.CheckpointManager(
      os.path.abspath(directory),
      options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))


def save_checkpoint(manager: ocp.CheckpointManager, step: int, state: TrainState,
                    meta: dict[str, Any]) -> None:
  """Saves the unreplicated ``state`` and a JSON ``meta`` dict at optimizer ``step``."""
  manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(_ckpt_tree(state)),
                                             meta=ocp.args.JsonSave(meta)))


def restore_checkpoint(manager: ocp.CheckpointManager, state: TrainState,
                       step: int | None = None) -> tuple[TrainState, dict[str, Any], int]:
  """Restores ``step`` (default: the newest) into the structure of ``state``.

  Returns:
    ``(state, meta, step)``.

  Raises:
    FileNotFoundError: if the manager's directory holds no checkpoint.
  """
  step = manager.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint in {manager.directory}")
  target = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, _ckpt_tree(state))
  restored = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
  tree = restored["state"]
  state = state.replace(step=tree["step"], params=tree["params"], opt_state=tree["opt_state"])
  return state, dict(restored["meta"]), step


# ----------------------------------------------------------------------------
# The loop.


def build_model(config: ml_collections.ConfigDict, data: tasks.TaskData):
  """The classifier for ``config.model`` sized to ``data``."""
  return models.build_classifier(config.model, vocab_size=data.vocab_size,
                                 num_classes=data.num_classes,
                                 dual=isinstance(data.train, PairedExamples))


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       step_hook: Callable[[int], None] | None = None,
                       data: tasks.TaskData | None = None) -> dict[str, Any]:
  """Trains, evaluates every ``eval_frequency`` steps, then tests the best checkpoint.

  Resumes from the newest checkpoint in ``workdir/checkpoints`` if there is
  one, and continues exactly as an uninterrupted run would (same data order,
  dropout keys and optimizer state). Writes ``workdir/metrics.jsonl``,
  TensorBoard events in ``workdir/tb``, ``workdir/config.json`` and, at the
  end, ``workdir/results.json``.

  Args:
    config: the run config (see ``configs/``).
    workdir: output directory; created if missing.
    step_hook: called with the optimizer step after each step and its
      checkpoint (tests use it to simulate a kill).
    data: preloaded task data; loaded from ``config`` when None.

  Returns:
    The contents of ``results.json``: test accuracy and loss of the
    best-validation checkpoint, its step and validation accuracy, the
    majority-class rates of the val and test examples evaluated, steps/s and wall time in seconds.

  Raises:
    ValueError: for an inconsistent config (see :func:`validate_config`).
  """
  wall_start = time.time()
  n_dev = jax.local_device_count()
  validate_config(config, jax.device_count())
  os.makedirs(workdir, exist_ok=True)
  data = data or tasks.load_task(config)
  model = build_model(config, data)

  init_rng, dropout_root = jax.random.split(jax.random.PRNGKey(int(config.seed)))
  state = create_train_state(config, model, init_rng)
  ckpts = checkpoint_manager(os.path.join(workdir, "checkpoints"), config.max_to_keep)
  best_ckpts = checkpoint_manager(os.path.join(workdir, "best"), 1)
  meta = {"best_val_accuracy": -1.0, "best_step": -1, "train_seconds": 0.0}
  start_step = 0
  if ckpts.latest_step() is not None:
    state, meta, start_step = restore_checkpoint(ckpts, state)
    print(f"Resumed from {workdir}/checkpoints at step {start_step}", file=sys.stderr)
  accum = config.grad_accum_steps
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(config.to_json_best_effort(indent=2))
  logger = MetricLogger(workdir, resume_step=start_step, enabled=jax.process_index() == 0)
  logger.write(start_step, {"params": sum(x.size for x in jax.tree_util.tree_leaves(state.params))},
               "info")

  p_train, p_eval = pmap_steps(model.apply)
  state_repl = flax.jax_utils.replicate(state)
  schedule = make_schedule(config)
  batches = train_batches(data.train, config, start_step * accum)
  window = {"loss": 0.0, "correct": 0.0, "count": 0.0}
  window_sums, window_steps = [], 0
  window_start, window_excluded = time.time(), 0.0
  val_majority = None   # majority rate of the examples the last validation read
  train_seconds = float(meta["train_seconds"])
  bar = tqdm.tqdm(total=config.num_train_steps, initial=start_step, desc="train",
                  dynamic_ncols=True, mininterval=1.0 if sys.stderr.isatty() else 30.0,
                  disable=jax.process_index() != 0)
  budget_s = 60.0 * float(config.get("max_train_minutes", 0) or 0)
  last_step = config.num_train_steps
  for step in range(start_step + 1, config.num_train_steps + 1):
    for a in range(accum):
      batch = shard(next(batches), n_dev)
      rng = jax.random.fold_in(dropout_root, (step - 1) * accum + a)
      state_repl, sums = p_train(state_repl, batch, rng)
      window_sums.append(sums)
    window_steps += 1
    bar.update(1)
    out_of_time = bool(budget_s) and time.time() - wall_start > budget_s
    final = step == config.num_train_steps or out_of_time

    if step % config.log_every == 0 or final:
      for sums in jax.device_get(window_sums):
        for k in window:
          window[k] += float(sums[k][0])
      elapsed = max(time.time() - window_start - window_excluded, 1e-9)
      train_seconds += elapsed
      count = max(window["count"], 1.0)
      logger.write(step, {"loss": window["loss"] / count, "accuracy": window["correct"] / count,
                          "learning_rate": float(schedule(step - 1)),
                          "steps_per_sec": window_steps / elapsed}, "train")
      bar.set_postfix(loss=f"{window['loss'] / count:.3f}",
                      acc=f"{window['correct'] / count:.3f}")
      window = dict.fromkeys(window, 0.0)
      window_sums, window_steps = [], 0
      window_start, window_excluded = time.time(), 0.0

    pause_start = time.time()
    if step % config.eval_frequency == 0 or final:
      val = evaluate(p_eval, state_repl.params, data.val, config,
                     config.get("num_eval_steps", -1))
      logger.write(step, val, "val")
      val_majority = val["majority_rate"]
      bar.write(f"step {step}: val accuracy {val['accuracy']:.4f} loss {val['loss']:.4f}")
      if val["accuracy"] > meta["best_val_accuracy"]:
        meta.update(best_val_accuracy=val["accuracy"], best_step=step)
        save_checkpoint(best_ckpts, step, unreplicate(state_repl), meta)

    if step % config.checkpoint_every == 0 or final:
      meta["train_seconds"] = train_seconds
      save_checkpoint(ckpts, step, unreplicate(state_repl), meta)
    if step_hook is not None:
      ckpts.wait_until_finished()
      best_ckpts.wait_until_finished()
      step_hook(step)
    window_excluded += time.time() - pause_start
    if out_of_time:
      last_step = step
      bar.write(f"max_train_minutes={config.max_train_minutes} reached after step {step}; "
                "rerun with the same workdir to continue")
      break
  bar.close()
  ckpts.wait_until_finished()
  best_ckpts.wait_until_finished()

  best_state, best_meta, best_step = restore_checkpoint(best_ckpts, state)
  params_repl = flax.jax_utils.replicate(best_state.params)
  test = evaluate(p_eval, params_repl, data.test, config, config.get("num_test_steps", -1))
  logger.write(best_step, test, "test")
  results = {
      "task": config.task, "attention": config.model.attention,
      "test_accuracy": test["accuracy"], "test_loss": test["loss"],
      "test_majority_rate": test["majority_rate"],
      "val_majority_rate": (val_majority if val_majority is not None
                            else data.val.majority_rate()),
      "best_step": best_step, "best_val_accuracy": best_meta["best_val_accuracy"],
      "num_train_steps": config.num_train_steps, "last_step": last_step,
      "steps_per_sec": last_step / max(train_seconds, 1e-9),
      "train_seconds": train_seconds,
      "wall_seconds_this_run": time.time() - wall_start,
      "num_devices": jax.device_count(), "data_source": data.source,
  }
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "results.json"), "w") as f:
      json.dump(results, f, indent=2)
  logger.close()
  return results


def load_run_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a run saved in ``workdir/config.json``.

  Raises:
    FileNotFoundError: if the file is missing (not a train.py workdir).
  """
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: is {workdir!r} a train.py workdir? "
                            "Pass --config to evaluate with an explicit config.")
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))


def evaluate_checkpoint(workdir: str, split: str = "test", which: str = "best",
                        step: int | None = None,
                        config: ml_collections.ConfigDict | None = None) -> dict[str, Any]:
  """Restores a checkpoint of ``workdir`` and evaluates it on ``split``.

  Args:
    workdir: a train.py run directory.
    split: ``"train"``, ``"val"`` or ``"test"``.
    which: ``"best"`` (the best-validation checkpoint) or ``"latest"``.
    step: restore this optimizer step from ``workdir/checkpoints`` instead.
    config: overrides the run's saved config.

  Returns:
    ``{"accuracy", "loss", "count", "step", "split", "checkpoint"}``.

  Raises:
    FileNotFoundError: when the workdir has no such checkpoint or config.
    ValueError: for an unknown split or ``which``.
  """
  if split not in ("train", "val", "test") or which not in ("best", "latest"):
    raise ValueError(f"split={split!r} / which={which!r} not understood")
  config = config or load_run_config(workdir)
  data = tasks.load_task(config)
  model = build_model(config, data)
  state = create_train_state(config, model, jax.random.PRNGKey(0))
  sub = "best" if which == "best" and step is None else "checkpoints"
  manager = checkpoint_manager(os.path.join(workdir, sub), config.max_to_keep)
  state, _, restored_step = restore_checkpoint(manager, state, step)
  _, p_eval = pmap_steps(model.apply)
  limit = config.get("num_test_steps", -1) if split == "test" else config.get("num_eval_steps", -1)
  metrics = evaluate(p_eval, flax.jax_utils.replicate(state.params), getattr(data, split),
                     config, limit)
  return {**metrics, "step": restored_step, "split": split,
          "checkpoint": os.path.join(workdir, sub)}
