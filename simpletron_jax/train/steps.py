"""Loss, metrics, data-parallel train and eval steps, placement, and calls in flight.

Loss and metrics follow LRA ``utils/train_utils.py`` and ``listops/train.py`` (Tay et al.,
2020). A *step* is one optimizer update on ``config.batch_size`` examples, made of
``config.grad_accum_steps`` *micro-steps* (``optax.MultiSteps``).
"""

from __future__ import annotations

import collections
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from clu import metrics as clu_metrics
from flax import struct
from flax.training import train_state

from simpletron_jax.data.common import Batch

AXIS = "batch"


class TrainState(train_state.TrainState):
  """flax TrainState; ``step`` counts micro-steps."""


def _cross_entropy(logits, targets, weights, **_):
  """Per-example cross-entropy ``[B]`` of float32 ``logits [B, C]`` and int ``targets [B]``."""
  return {"values": optax.softmax_cross_entropy_with_integer_labels(logits, targets),
          "weights": weights}


def _correct(logits, targets, weights, **_):
  """1.0 where the arg-max of ``logits [B, C]`` is the ``targets [B]`` label, else 0.0."""
  return {"values": (jnp.argmax(logits, -1) == targets).astype(jnp.float32), "weights": weights}


@struct.dataclass
class Mean(clu_metrics.Average):
  """clu ``Average`` under float32 weights (1 real, 0 filler). Weights multiply, as in LRA
  ``compute_weighted_cross_entropy`` (``utils/train_utils.py``), so a filler row's NaN shows."""

  @classmethod
  def from_model_output(cls, values, weights, **_) -> Mean:
    """Weighted sum and weight sum of float32 ``values`` and ``weights``, ``[B]`` or ``[B, L]``."""
    return cls(total=jnp.sum(values * weights), count=jnp.sum(weights))

  def compute(self) -> float:
    """``total / count`` on the host in float64 (a Python float); a count of 0 gives 0."""
    return float(self.total) / max(float(self.count), 1.0)


@struct.dataclass
class MajorityRate(clu_metrics.Metric):
  """Rows per class label (rows of weight > 0) and rows with a label outside ``[0, K)``, int32;
  ``compute`` gives the accuracy of always answering the most frequent label."""

  counts: jnp.ndarray
  outside: jnp.ndarray

  @classmethod
  def from_model_output(cls, labels, label_weights, num_classes: int, **_) -> MajorityRate:
    """Counts of int ``labels [B]`` whose float32 ``label_weights [B]`` are > 0, as ``[K]``."""
    real_B = label_weights > 0
    inside_B = (labels >= 0) & (labels < num_classes)
    one_hot_BxK = jax.nn.one_hot(labels, num_classes, dtype=jnp.int32)
    return cls(counts=jnp.sum(one_hot_BxK * real_B[:, None], axis=0, dtype=jnp.int32),
               outside=jnp.sum(real_B & ~inside_B, dtype=jnp.int32))

  @classmethod
  def empty(cls) -> MajorityRate:
    """No rows and no classes yet (``[0]`` counts); merging takes the other side's classes."""
    return cls(counts=jnp.zeros((0,), jnp.int32), outside=jnp.array(0, jnp.int32))

  def merge(self, other: MajorityRate) -> MajorityRate:
    """The counts of both, added per class (:meth:`empty` adds nothing)."""
    if not self.counts.shape[-1] or not other.counts.shape[-1]:   # empty() knows no classes
      return other if not self.counts.shape[-1] else self
    return type(self)(counts=self.counts + other.counts, outside=self.outside + other.outside)

  def compute(self) -> float:
    """``max(counts) / sum(counts)`` on the host in float64 (a Python float); 0 for no rows.

    Raises:
      ValueError: some rows carry a label outside ``[0, K)``.
    """
    counts_K = np.asarray(self.counts, np.float64)
    if int(self.outside):
      raise ValueError(f"{int(self.outside)} evaluated rows carry a label outside "
                       f"[0, {counts_K.shape[-1]}), the model's number of classes")
    total = counts_K.sum()
    return float(counts_K.max() / total) if total else 0.0


# Metrics of train windows; validation and test add the majority rate of their labels.
Metrics = clu_metrics.Collection.create(loss=Mean.from_fun(_cross_entropy),
                                        accuracy=Mean.from_fun(_correct))
EvalMetrics = clu_metrics.Collection.create(loss=Mean.from_fun(_cross_entropy),
                                            accuracy=Mean.from_fun(_correct),
                                            majority_rate=MajorityRate)


def metrics_of(logits_BxC, targets_B, weights_B, collection=Metrics, **labels):
  """``collection`` of float ``logits_BxC`` (cast to float32), int ``targets_B`` and float32
  ``weights_B`` (1 real, 0 filler); ``labels`` feed :class:`MajorityRate`."""
  return collection.single_from_model_output(logits=logits_BxC.astype(jnp.float32),
                                             targets=targets_B, weights=weights_B, **labels)


def means(metrics) -> dict[str, float]:
  """``{name: mean}`` of a host collection's :class:`Mean` s and ``count`` (weight sum)."""
  return {**{name: m.compute() for name, m in vars(metrics).items() if isinstance(m, Mean)},
          "count": float(metrics.loss.count)}


def _forward(params, apply_fn, batch: Batch, dropout_rng, deterministic: bool) -> dict:
  """The model's ``logits``, ``targets`` and ``weights`` for the metrics, and ``num_classes``.

  ``batch``: ``inputs`` int32 and ``mask`` bool ``[B, L]``, ``targets`` int32 and ``weights``
  float32 ``[B]`` (dual encoder: also ``inputs2``, ``mask2``). A key folded from
  ``dropout_rng`` feeds ``random_features`` (Performer). A pretraining model
  (``pretraining.MaskedLMEncoder``) gives ``logits`` ``[B, L, V]``, ``targets`` and
  ``weights`` ``[B, L]`` (per target token) and its task's ``num_classes``.
  """
  second = (batch["inputs2"], batch["mask2"]) if "inputs2" in batch else ()
  logits = apply_fn({"params": params}, batch["inputs"], batch["mask"], *second,
                    deterministic=deterministic,
                    rngs={"dropout": dropout_rng,
                          "random_features": jax.random.fold_in(dropout_rng, 0x5EED)})
  if isinstance(logits, dict):   # a pretraining objective: token-level targets
    return {**logits, "weights": logits["weights"] * batch["weights"][:, None]}
  return {"logits": logits, "targets": batch["targets"], "weights": batch["weights"],
          "num_classes": logits.shape[-1]}


def loss_fn(params, apply_fn, batch: Batch, dropout_rng, deterministic: bool):
  """``(mean cross-entropy over the real examples, Metrics)`` of ``batch`` (:func:`_forward`)."""
  out = _forward(params, apply_fn, batch, dropout_rng, deterministic)
  metrics = metrics_of(out["logits"], out["targets"], out["weights"])
  return metrics.loss.total / jnp.maximum(metrics.loss.count, 1.0), metrics


def train_step(state: TrainState, batch: Batch, dropout_rng):
  """One micro-step on this device's rows, mapped over axis :data:`AXIS`.

  Returns ``(new_state, {"metrics", "grad_norm"})``: the ``psum``med :data:`Metrics` and the
  L2 norm of the ``pmean``ed gradient (read by the non-finite guard).
  """
  dropout_rng = jax.random.fold_in(dropout_rng, jax.lax.axis_index(AXIS))
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  (_, metrics), grads = grad_fn(state.params, state.apply_fn, batch, dropout_rng, False)
  grads = jax.lax.pmean(grads, AXIS)
  return state.apply_gradients(grads=grads), {"metrics": jax.lax.psum(metrics, AXIS),
                                              "grad_norm": optax.tree.norm(grads)}


def eval_step(params, apply_fn, batch: Batch):
  """:data:`EvalMetrics` of one deterministic forward pass, ``psum``med over devices; the
  majority rate counts the examples' class labels ``batch["targets"]`` (also for SPT)."""
  out = _forward(params, apply_fn, batch, jax.random.PRNGKey(0), True)
  metrics = metrics_of(out["logits"], out["targets"], out["weights"], EvalMetrics,
                       labels=batch["targets"], label_weights=batch["weights"],
                       num_classes=out["num_classes"])
  return jax.lax.psum(metrics, AXIS)


def pmap_steps(apply_fn, devices=None):
  """Pmapped ``(train(state, batch, rng), eval(params, batch))`` over ``devices`` (default:
  local): state and params replicated, batches ``[n_devices, B / n_devices, ...]``."""
  p_train = jax.pmap(train_step, axis_name=AXIS, in_axes=(0, 0, None),
                     donate_argnums=(0,), devices=devices)
  p_eval = jax.pmap(lambda p, b: eval_step(p, apply_fn, b), axis_name=AXIS, devices=devices)
  return p_train, p_eval


def jit_steps(apply_fn, mesh: jax.sharding.Mesh):
  """:func:`pmap_steps`' function under ``jax.jit`` of ``jax.shard_map`` over the one-axis
  ``mesh`` (https://docs.jax.dev/en/latest/migrate_pmap.html), on global arrays: the state
  replicated (``P()``, donated by ``train``), each batch ``[B, ...]`` split by rows (``P(AXIS)``).
  """
  rep, rows = jax.sharding.PartitionSpec(), jax.sharding.PartitionSpec(AXIS)
  # check_vma=False, else train_step's pmean doubles the gradient (docs/scaling.md).
  train = jax.jit(jax.shard_map(train_step, mesh=mesh, in_specs=(rep, rows, rep),
                                out_specs=(rep, rep), check_vma=False), donate_argnums=(0,))
  evaluate = jax.jit(jax.shard_map(lambda p, b: eval_step(p, apply_fn, b), mesh=mesh,
                                   in_specs=(rep, rows), out_specs=rep, check_vma=False))
  return train, evaluate


# One pair of steps per apply function (``train_state`` gives equal models one), so a process
# that trains the same model again reuses its traced and compiled steps.
_cached_pmap_steps = functools.lru_cache(maxsize=8)(pmap_steps)
_cached_jit_steps = functools.lru_cache(maxsize=8)(jit_steps)


class PmapParallel:
  """LRA's parallelism, ``"pmap"``: state leaves ``[n_local_devices, ...]``, batches
  ``[n_local_devices, rows / n_local_devices, ...]``."""

  name = "pmap"

  def steps(self, apply_fn):
    """``(train, eval)`` steps (:func:`pmap_steps`), the same for the same ``apply_fn``."""
    return _cached_pmap_steps(apply_fn)

  def put_state(self, tree):
    """A host pytree as the steps take it (:func:`replicate`)."""
    return replicate(tree)

  def put_batch(self, batch: Batch) -> Batch:
    """This host's ``[rows, ...]`` numpy batch as the steps take it (:func:`shard`)."""
    return shard(batch, jax.local_device_count())

  def abstract_batch(self, batch: Batch) -> dict:
    """``jax.ShapeDtypeStruct`` s of :meth:`put_batch`'s result, for ahead-of-time lowering."""
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype)
            for k, v in self.put_batch(batch).items()}

  def host(self, tree):
    """Every leaf's first device copy as numpy, without a device computation (indexing would
    launch one per leaf: :class:`InFlightLimit`)."""
    return jax.tree_util.tree_map(
        lambda x: np.asarray(x.addressable_data(0)).reshape(x.shape[1:]), tree)


class JitParallel:
  """``"jit"``: :class:`PmapParallel`'s methods for :func:`jit_steps` over a mesh of
  ``jax.devices()`` (each device gets ``pmap``'s rows and dropout key)."""

  name = "jit"

  def __init__(self, devices=None):
    self.mesh = jax.sharding.Mesh(np.asarray(devices or jax.devices()), (AXIS,))
    self.replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
    self.rows = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(AXIS))

  def steps(self, apply_fn):
    """``(train, eval)`` steps (:func:`jit_steps`), the same for the same ``apply_fn``."""
    return _cached_jit_steps(apply_fn, self.mesh)

  def put_state(self, tree):
    """A host pytree, the same on every process, as replicated global arrays."""
    def put(x):
      x = np.asarray(x)
      return jax.make_array_from_callback(x.shape, self.replicated, lambda index: x[index])
    return jax.tree_util.tree_map(put, tree)

  def put_batch(self, batch: Batch) -> Batch:
    """This process's ``[rows, ...]`` batch as its rows of a global ``[rows * processes, ...]``."""
    return {k: jax.make_array_from_process_local_data(self.rows, v) for k, v in batch.items()}

  def abstract_batch(self, batch: Batch) -> dict:
    """``jax.ShapeDtypeStruct`` s (with sharding) of :meth:`put_batch`'s result."""
    hosts = jax.process_count()
    return {k: jax.ShapeDtypeStruct((v.shape[0] * hosts, *v.shape[1:]), v.dtype,
                                    sharding=self.rows) for k, v in batch.items()}

  def host(self, tree):
    """This process's first copy of every leaf, as numpy (no device computation)."""
    return jax.tree_util.tree_map(lambda x: np.asarray(x.addressable_data(0)), tree)


PARALLELISMS = {"pmap": PmapParallel, "jit": JitParallel}


def make_parallel(name: str) -> PmapParallel | JitParallel:
  """The data parallelism ``config.parallelism`` names.

  Raises:
    ValueError: ``name`` is not "pmap" or "jit".
  """
  if name not in PARALLELISMS:
    raise ValueError(f"config.parallelism={name!r} is not one of {sorted(PARALLELISMS)}")
  return PARALLELISMS[name]()


def batch_shape_key(batch: Batch) -> tuple:
  """``((field, shape), ...)`` of a batch, sorted by field: one compiled step per key."""
  return tuple(sorted((k, tuple(v.shape)) for k, v in batch.items()))


@functools.lru_cache(maxsize=None)
def _pmapped_identity(devices: tuple | None) -> Callable:
  return jax.pmap(lambda tree: tree, axis_name=AXIS, devices=devices)


def replicate(tree, devices=None):
  """Every leaf ``x`` as a ``[n_devices, *x.shape]`` array, same dtype, in the pmapped steps'
  output sharding (``flax.jax_utils.replicate``'s makes step 2 recompile: docs/scaling.md)."""
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
  """Keeps at most ``limit`` dispatched device calls unfinished, waiting for the oldest.

  Unbounded run-ahead deadlocks XLA's CPU client with several devices, which accept 32
  unfinished computations each (docs/faults.md); a call may be several computations, so
  ``limit`` times that must stay under 32.

  Raises:
    ValueError: ``limit`` < 1.
  """

  def __init__(self, limit: int = CALLS_IN_FLIGHT):
    if limit < 1:
      raise ValueError(f"limit={limit} must be >= 1")
    self.limit = limit
    self._pending: collections.deque = collections.deque()

  def add(self, outputs) -> None:
    """Records one call's outputs (never donated later); waits while over ``limit``."""
    self._pending.append(outputs)
    while len(self._pending) > self.limit:
      jax.block_until_ready(self._pending.popleft())
