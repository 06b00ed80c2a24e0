"""What a run starts from: the learning-rate schedule, the optimizer, the model and its train state.

LRA ``utils/train_utils.py`` and ``listops/train.py`` (Tay et al., 2020), with optax AdamW
instead of flax.optim. A *step* is one optimizer update on ``batch_size`` examples.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import flax
import jax
import numpy as np
import optax

from simpletron_jax.data import tasks
from simpletron_jax.model import encoders, lora, transfer
from simpletron_jax.train import pretraining, schedules
from simpletron_jax.data.common import PairedExamples
from simpletron_jax.train.run_config import RunConfig, TrainConfig
from simpletron_jax.train.steps import TrainState


def make_schedule(train: TrainConfig) -> Callable:
  """The learning-rate schedule of ``train`` (steps are optimizer updates)."""
  return schedules.create_learning_rate_schedule(
      factors=train.factors, base_learning_rate=train.learning_rate,
      warmup_steps=train.warmup, steps_per_cycle=train.num_train_steps)


def make_optimizer(train: TrainConfig) -> optax.GradientTransformation:
  """AdamW with LRA's decoupled decay ``p -= lr * wd * p``, after global-norm clipping when
  ``grad_clip_norm > 0`` (LRA's Path-X recipe); frozen and LoRA base parameters get zero
  updates; ``optax.MultiSteps`` when ``grad_accum_steps > 1``. One object per equal optimizer
  within a process, whatever the fields it does not read (the seed, the batch size, the run's
  length unless the schedule decays over it), so runs of an equal model reuse their traced
  and compiled steps."""
  cycle = "cosine_decay" in train.factors   # the one factor that reads num_train_steps
  return _optimizer(dataclasses.replace(
      train, num_train_steps=train.num_train_steps if cycle else 1, batch_size=1, seed=0,
      init_from="", init_include=(), max_train_minutes=0.0, parallelism="pmap",
      lora=dataclasses.replace(train.lora, alpha=0.0, targets=())))


@functools.lru_cache(maxsize=8)
def _optimizer(train: TrainConfig) -> optax.GradientTransformation:
  tx = optax.adamw(make_schedule(train), b1=train.adam_b1, b2=train.adam_b2,
                   eps=train.adam_eps, weight_decay=train.weight_decay)
  if train.grad_clip_norm > 0:
    tx = optax.chain(optax.clip_by_global_norm(float(train.grad_clip_norm)), tx)
  frozen = tuple(train.freeze) + ((f"^{lora.BASE}/",) if train.lora.rank > 0 else ())
  if frozen:
    tx = transfer.freeze(tx, frozen)
  if train.grad_accum_steps > 1:
    tx = optax.MultiSteps(tx, every_k_schedule=train.grad_accum_steps)
  return tx


@functools.lru_cache(maxsize=8)
def _init_fn(model: flax.linen.Module, length: int) -> Callable:
  """The jitted ``rng -> params`` of ``model`` on ``[1, length]`` int32 tokens, one per equal
  model within a process."""
  tokens = np.ones((1, length), np.int32)   # numpy: nothing of a caller's trace is kept
  second = (tokens, None) if isinstance(model, encoders.DualEncoderClassifier) else ()
  return jax.jit(lambda r: model.init({"params": r}, tokens, None, *second,
                                      deterministic=True)["params"])


@functools.lru_cache(maxsize=8)
def _apply_of(model: flax.linen.Module) -> Callable:
  """``model.apply``, the same bound method for equal models, so their compiled steps are
  reused within a process."""
  return model.apply


def create_train_state(train: TrainConfig, model: flax.linen.Module, rng: jax.Array,
                       max_length: int) -> TrainState:
  """An unreplicated TrainState at step 0, its parameters initialised from ``rng`` on
  ``min(max_length, 16)`` int32 tokens; with ``train.lora.rank > 0`` they are
  ``{"base", "lora"}`` and ``apply_fn`` merges them (:mod:`simpletron_jax.model.lora`)."""
  params = _init_fn(model, min(max_length, 16))(rng)
  apply_fn, rank = _apply_of(model), train.lora.rank
  if rank > 0:
    params = lora.wrap(params, train.lora.targets, rank, jax.random.fold_in(rng, 0x10A))
    apply_fn = lora.wrap_apply(model.apply, lora.scale_of(rank, train.lora.alpha))
  return TrainState.create(apply_fn=apply_fn, params=params, tx=make_optimizer(train))


def build_model(run: RunConfig, data: tasks.TaskData):
  """The classifier for ``run.model`` sized to ``data``; with a ``pretrain`` section (the
  ``:spt`` / ``:spt_ft`` configs), the self-pretraining LM model or the fine-tuning
  classifier with the [MASK] row reserved (:func:`pretraining.build_model`).

  Raises:
    ValueError: naming ``pretrain.objective`` (:func:`pretraining.check_model`).
  """
  sizes = dict(vocab_size=data.vocab_size, num_classes=data.num_classes,
               dual=isinstance(data.train, PairedExamples))
  if run.pretrain is not None:
    return pretraining.build_model(run.model, run.pretrain, **sizes)
  return encoders.build_classifier(run.model, **sizes)
