"""The device steps: loss, data-parallel train and eval steps, placement, and calls in flight.

The loss and metrics follow LRA ``utils/train_utils.py`` and ``listops/train.py`` (Tay et al.,
2020), with metrics as a clu ``Collection`` of sums over the real examples of a batch
(:data:`Metrics`; filler rows weigh 0). Each
device runs :func:`train_step` on its rows (axis :data:`AXIS`): gradients are ``pmean``ed
and metrics ``psum``med, so every device holds the same state. ``config.parallelism``
picks how (:func:`make_parallel`): under ``jax.pmap`` over the local devices
(:class:`PmapParallel`, LRA's; :func:`replicate`, :func:`unreplicate` and :func:`shard` move
a state and a batch to and from its layout), or under ``jax.jit`` of ``jax.shard_map`` over a
``Mesh`` of all devices, with global arrays (:class:`JitParallel`). :class:`InFlightLimit`
bounds how far the host runs ahead of the devices.

Units: a *step* is one optimizer update on ``config.batch_size`` examples; with
``config.grad_accum_steps = A`` it is made of A *micro-steps* of ``batch_size / A`` examples
each (``optax.MultiSteps``); :class:`TrainState` counts micro-steps.
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
  """flax TrainState; ``step`` counts micro-steps (see the module docstring)."""


def _cross_entropy(logits, targets, weights, **_):
  """Per-example cross-entropy ``[B]`` of float32 ``logits [B, C]`` and int ``targets [B]``."""
  return {"values": optax.softmax_cross_entropy_with_integer_labels(logits, targets),
          "weights": weights}


def _correct(logits, targets, weights, **_):
  """1.0 where the arg-max of ``logits [B, C]`` is the ``targets [B]`` label, else 0.0."""
  return {"values": (jnp.argmax(logits, -1) == targets).astype(jnp.float32), "weights": weights}


@struct.dataclass
class Mean(clu_metrics.Average):
  """clu's ``Average`` of per-example values under float weights (1: a real example, 0: a
  filler row): ``total`` = sum of weight * value and ``count`` = sum of weights, float32 on
  the device; ``merge`` adds both (clu's). Weights multiply, as in LRA's
  ``compute_weighted_cross_entropy`` (``utils/train_utils.py``), rather than clu's boolean
  mask selecting, so a non-finite value of a filler row still shows in the sum."""

  @classmethod
  def from_model_output(cls, values, weights, **_) -> Mean:
    """``values`` and ``weights`` float32 ``[B]`` (or ``[B, L]``): their weighted sum and the
    weights' sum."""
    return cls(total=jnp.sum(values * weights), count=jnp.sum(weights))

  def compute(self) -> float:
    """``total / count`` on the host in float64 (a Python float); a count of 0 gives 0."""
    return float(self.total) / max(float(self.count), 1.0)


# The metrics of every train window, validation and test: a clu Collection built from the
# float32 logits ``[B, C]``, int labels ``[B]`` and float32 weights ``[B]`` (``from_model_output``
# of each), merged over batches and devices; a new metric is one line here.
Metrics = clu_metrics.Collection.create(loss=Mean.from_fun(_cross_entropy),
                                        accuracy=Mean.from_fun(_correct))


def metrics_of(logits_BxC, targets_B, weights_B):
  """:data:`Metrics` of one batch: ``logits_BxC`` float (cast to float32 first), ``targets_B``
  int labels, ``weights_B`` float32 (1 real, 0 filler)."""
  return Metrics.single_from_model_output(logits=logits_BxC.astype(jnp.float32),
                                          targets=targets_B, weights=weights_B)


def means(metrics) -> dict[str, float]:
  """``{name: mean}`` of a host :data:`Metrics` (``Collection.compute``) and ``count``, the
  weight sum (examples read), as Python floats."""
  return {**metrics.compute(), "count": float(metrics.loss.count)}


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
    ``(loss scalar, Metrics of the batch)`` (:func:`metrics_of`). A self-pretraining model
    (:class:`simpletron_jax.train.pretraining.MaskedLMEncoder`) returns a dict of per-token
    ``logits`` ``[B, L, V]``, ``targets`` and ``weights`` ``[B, L]`` instead of ``[B, C]``
    logits; the metrics are then over its target tokens (masked or next tokens) of the real
    rows, so ``count`` is the number of target tokens and the accuracy a per-token one.
  """
  second = (batch["inputs2"], batch["mask2"]) if "inputs2" in batch else ()
  logits = apply_fn({"params": params}, batch["inputs"], batch["mask"], *second,
                    deterministic=deterministic,
                    rngs={"dropout": dropout_rng,
                          "random_features": jax.random.fold_in(dropout_rng, 0x5EED)})
  if isinstance(logits, dict):   # a pretraining objective: token-level targets
    metrics = metrics_of(logits["logits"], logits["targets"],
                         logits["weights"] * batch["weights"][:, None])
  else:
    metrics = metrics_of(logits, batch["targets"], batch["weights"])
  return metrics.loss.total / jnp.maximum(metrics.loss.count, 1.0), metrics


def train_step(state: TrainState, batch: Batch, dropout_rng):
  """One micro-step on this device's shard; call it under ``pmap(axis_name="batch")``.

  Gradients are ``pmean``ed and the :data:`Metrics` ``psum``med over the devices (clu's
  merge of every device's, in one all-reduce).

  Returns:
    ``(new_state, {"metrics", "grad_norm"})``: the :data:`Metrics` of the global micro-batch,
    and the global L2 norm of the averaged gradient (the non-finite guard reads it).
  """
  dropout_rng = jax.random.fold_in(dropout_rng, jax.lax.axis_index(AXIS))
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  (_, metrics), grads = grad_fn(state.params, state.apply_fn, batch, dropout_rng, False)
  grads = jax.lax.pmean(grads, AXIS)
  return state.apply_gradients(grads=grads), {"metrics": jax.lax.psum(metrics, AXIS),
                                              "grad_norm": optax.tree.norm(grads)}


def eval_step(params, apply_fn, batch: Batch):
  """:data:`Metrics` of one deterministic forward pass, ``psum``med over devices."""
  _, metrics = loss_fn(params, apply_fn, batch, jax.random.PRNGKey(0), True)
  return jax.lax.psum(metrics, AXIS)


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


def jit_steps(apply_fn, mesh: jax.sharding.Mesh):
  """The train and eval steps of :func:`pmap_steps` under ``jax.jit`` over ``mesh``.

  Each step is :func:`train_step` / :func:`eval_step` itself, run on every device of the
  one-axis ``mesh`` (axis :data:`AXIS`) by ``jax.shard_map``: each device computes the loss
  and gradients of its rows with its own dropout key, and the gradients are ``pmean``ed, so
  the function computed is the one ``pmap`` computes (JAX's migration guide from ``pmap``:
  https://docs.jax.dev/en/latest/migrate_pmap.html). Unlike ``pmap``'s, the inputs and
  outputs are global ``jax.Array`` s: the state once, replicated (``NamedSharding(mesh, P())``),
  and each batch ``[B, ...]`` split by rows over the devices (``P(AXIS)``), on one or several
  processes.

  Args:
    apply_fn: ``model.apply``.
    mesh: a one-axis mesh named :data:`AXIS` (:class:`JitParallel` builds it).

  Returns:
    ``(train(state, batch, rng) -> (state, metrics), eval(params, batch) -> metrics)``; the
    state argument of ``train`` is donated; the metrics are replicated scalars.
  """
  rep, rows = jax.sharding.PartitionSpec(), jax.sharding.PartitionSpec(AXIS)
  # check_vma=False: with JAX's varying-axes checks on, differentiating the replicated
  # params inside shard_map already sums the gradients over the devices, and train_step's
  # pmean would then return twice the mean on 2 devices (docs/scaling.md).
  train = jax.jit(jax.shard_map(train_step, mesh=mesh, in_specs=(rep, rows, rep),
                                out_specs=(rep, rep), check_vma=False), donate_argnums=(0,))
  evaluate = jax.jit(jax.shard_map(lambda p, b: eval_step(p, apply_fn, b), mesh=mesh,
                                   in_specs=(rep, rows), out_specs=rep, check_vma=False))
  return train, evaluate


class PmapParallel:
  """LRA's data parallelism (``config.parallelism = "pmap"``): :func:`pmap_steps` over the
  local devices; states carry a leading ``[n_local_devices]`` copy axis and batches are
  reshaped to ``[n_local_devices, rows / n_local_devices, ...]``.

  The methods move trees between the host and the steps' layout, so the training loop is the
  same for both parallelisms (:class:`JitParallel`).
  """

  name = "pmap"

  def steps(self, apply_fn):
    """``(train, eval)`` steps (:func:`pmap_steps`)."""
    return pmap_steps(apply_fn)

  def put_state(self, tree):
    """A host pytree (a state or params) as the steps take it (:func:`replicate`)."""
    return replicate(tree)

  def put_batch(self, batch: Batch) -> Batch:
    """This host's ``[rows, ...]`` numpy batch as the steps take it (:func:`shard`)."""
    return shard(batch, jax.local_device_count())

  def abstract_batch(self, batch: Batch) -> dict:
    """``jax.ShapeDtypeStruct`` s of :meth:`put_batch`'s result, for ahead-of-time lowering."""
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype)
            for k, v in self.put_batch(batch).items()}

  def host(self, tree):
    """One copy of a tree the steps returned (state, metrics) as numpy arrays: every leaf's
    first device copy, copied to the host without running a computation on the devices
    (indexing, as :func:`unreplicate` does, would launch one per leaf, and the CPU devices
    of the tests accept only so many unfinished ones: :class:`InFlightLimit`)."""
    return jax.tree_util.tree_map(
        lambda x: np.asarray(x.addressable_data(0)).reshape(x.shape[1:]), tree)


class JitParallel:
  """Data parallelism under ``jax.jit`` (``config.parallelism = "jit"``): :func:`jit_steps`
  over a mesh of every device of every process, in ``jax.devices()`` order (so each device's
  rows and dropout key are those ``pmap`` gives it).

  Same methods as :class:`PmapParallel`: states are global arrays replicated on the mesh,
  and a batch is a global ``[B, ...]`` array whose rows are split over the devices, each
  process supplying its own rows (``jax.make_array_from_process_local_data``).
  """

  name = "jit"

  def __init__(self, devices=None):
    self.mesh = jax.sharding.Mesh(np.asarray(devices or jax.devices()), (AXIS,))
    self.replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
    self.rows = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(AXIS))

  def steps(self, apply_fn):
    """``(train, eval)`` steps (:func:`jit_steps`)."""
    return jit_steps(apply_fn, self.mesh)

  def put_state(self, tree):
    """A host pytree, the same on every process, as one replicated global array per leaf."""
    def put(x):
      x = np.asarray(x)
      return jax.make_array_from_callback(x.shape, self.replicated, lambda index: x[index])
    return jax.tree_util.tree_map(put, tree)

  def put_batch(self, batch: Batch) -> Batch:
    """This process's ``[rows, ...]`` numpy batch as its rows of a global
    ``[rows * process_count, ...]`` array split over the mesh."""
    return {k: jax.make_array_from_process_local_data(self.rows, v) for k, v in batch.items()}

  def abstract_batch(self, batch: Batch) -> dict:
    """``jax.ShapeDtypeStruct`` s (with sharding) of :meth:`put_batch`'s result."""
    hosts = jax.process_count()
    return {k: jax.ShapeDtypeStruct((v.shape[0] * hosts, *v.shape[1:]), v.dtype,
                                    sharding=self.rows) for k, v in batch.items()}

  def host(self, tree):
    """This process's first copy of every leaf of a replicated global tree, as numpy
    arrays (no device computation; works where the array spans other processes)."""
    return jax.tree_util.tree_map(lambda x: np.asarray(x.addressable_data(0)), tree)


PARALLELISMS = {"pmap": PmapParallel, "jit": JitParallel}


def make_parallel(name: str) -> PmapParallel | JitParallel:
  """The data parallelism ``config.parallelism`` names.

  Raises:
    ValueError: ``name`` is not "pmap" or "jit", naming ``config.parallelism``.
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
  """One copy of every leaf per device, laid out as the pmapped steps return their state.

  ``flax.jax_utils.replicate`` places the copies under a sharding whose mesh axis is not
  :data:`AXIS`. JAX (0.10) implements ``pmap`` with ``jit``, whose cache key includes the
  input shardings, so the state the first train step returns differs in sharding from the
  state it was given, and the second step would build the whole train step again
  (``benchmarks/results/cpu/replicate_compiles.md``). Passing the copies through a
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
  reduce``; ``benchmarks/results/cpu/dispatch_deadlock/`` and docs/benchmarks.md). On an
  accelerator the bound still leaves ``limit`` calls queued.

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
