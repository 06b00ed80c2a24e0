"""LoRA adapters (Hu et al., 2021, "LoRA: Low-Rank Adaptation of Large Language Models")
as a transform of the parameter tree, so the linen modules stay unchanged.

A kernel ``W`` chosen by a path pattern gets two factors, ``A`` (``[n_in, r]``, normal with
std ``1/sqrt(n_in)``) and ``B`` (``[r, n_out]``, zeros), and the model runs with::

    W_eff = W + (alpha / r) * reshape(A @ B, W.shape)

so at initialisation (``B = 0``) the adapted model computes exactly the base model. The
trainable tree is ``{"base": params, "lora": adapters}``; :func:`wrap_apply` merges the two
before every ``model.apply`` and ``config.freeze``-style freezing of ``base/`` (done by
``train.train_state.make_optimizer`` when ``config.lora.rank > 0``) trains the adapters only. This
is how Chan & Ong's linear-attention study re-aligns a swapped model (rank 32 on W_q, W_k,
W_v and W_o).

Why not a library: ``peft`` is PyTorch only, and ``jax-lorax`` (last release February 2024)
rewrites the traced function through ``qax`` implicit arrays, which follow JAX internals
that have changed since; merging a parameter tree needs neither.

A kernel is viewed as a matrix ``[n_in, n_out]``: an attention ``out`` kernel
(``DenseGeneral`` over the head axes, ``[H, K, E]``) as ``[H*K, E]``, every other kernel
(``query``/``key``/``value`` ``[E, H, K]``, ``Dense`` ``[in, out]``) as its first axis
against the rest.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

BASE, ADAPTERS = "base", "lora"


def _input_axes(path: str, kernel) -> int:
  """How many leading axes of ``kernel`` are inputs (see the module docstring)."""
  return kernel.ndim - 1 if path.endswith("out/kernel") else 1


def target_paths(params, targets: Sequence[str]) -> list[str]:
  """The ``/``-joined paths of ``params`` that match any regex in ``targets`` (``re.search``).

  Raises:
    ValueError: if a pattern matches no path (config field ``lora.targets``); the
      message lists the kernel paths there are.
  """
  flat = traverse_util.flatten_dict(params, sep="/")
  chosen = []
  for pattern in targets:
    hits = [p for p in flat if re.search(pattern, p)]
    if not hits:
      kernels = [p for p in flat if p.endswith("kernel")]
      raise ValueError(f"lora.targets pattern {pattern!r} matches no parameter; kernels: "
                       f"{kernels}")
    chosen += [p for p in hits if p not in chosen]
  return sorted(chosen)


def init_adapters(params, targets: Sequence[str], rank: int, rng: jax.Array) -> dict:
  """Adapters ``{path...: {"a": [n_in, r], "b": [r, n_out]}}`` for the targeted kernels.

  Args:
    params: the base parameter tree.
    targets: regexes of the kernel paths to adapt.
    rank: r > 0.
    rng: key for the ``A`` factors.

  Returns:
    A nested dict mirroring the targeted paths; ``B`` is zero, dtype float32.

  Raises:
    ValueError: for ``rank <= 0`` (``lora.rank``) or a pattern that matches nothing.
  """
  if rank <= 0:
    raise ValueError(f"lora.rank={rank} must be positive")
  flat = traverse_util.flatten_dict(params, sep="/")
  adapters = {}
  for i, path in enumerate(target_paths(params, targets)):
    kernel = flat[path]
    n_in = int(np.prod(kernel.shape[:_input_axes(path, kernel)]))
    n_out = kernel.size // n_in
    a = jax.random.normal(jax.random.fold_in(rng, i), (n_in, rank)) / math.sqrt(n_in)
    adapters[path + "/a"] = a
    adapters[path + "/b"] = jnp.zeros((rank, n_out), jnp.float32)
  return traverse_util.unflatten_dict(adapters, sep="/")


def wrap(params, targets: Sequence[str], rank: int, rng: jax.Array) -> dict:
  """``{"base": params, "lora": init_adapters(...)}``, the tree that LoRA training updates."""
  return {BASE: params, ADAPTERS: init_adapters(params, targets, rank, rng)}


def is_wrapped(params) -> bool:
  """Whether ``params`` is a ``{"base", "lora"}`` tree made by :func:`wrap`."""
  return isinstance(params, dict) and set(params) == {BASE, ADAPTERS}


def merge(wrapped, scale: float) -> Any:
  """The base tree with ``scale * A @ B`` added to every adapted kernel.

  Args:
    wrapped: a tree made by :func:`wrap`.
    scale: ``alpha / rank``.

  Returns:
    A parameter tree shaped like ``wrapped["base"]``.
  """
  flat = traverse_util.flatten_dict(wrapped[BASE], sep="/")
  adapters = traverse_util.flatten_dict(wrapped[ADAPTERS], sep="/")
  for path in {p.rsplit("/", 1)[0] for p in adapters}:
    delta = adapters[path + "/a"] @ adapters[path + "/b"]
    kernel = flat[path]
    flat[path] = kernel + (scale * delta).reshape(kernel.shape).astype(kernel.dtype)
  return traverse_util.unflatten_dict(flat, sep="/")


def scale_of(rank: int, alpha: float) -> float:
  """``alpha / rank``, with ``alpha = 0`` read as ``alpha = rank`` (scale 1)."""
  return (alpha or rank) / rank


def wrap_apply(apply_fn: Callable, scale: float) -> Callable:
  """``apply_fn`` taking ``{"params": wrapped, ...}``: it merges, then calls ``apply_fn``."""

  def apply(variables, *args, **kwargs):
    return apply_fn({**variables, "params": merge(variables["params"], scale)},
                    *args, **kwargs)

  return apply
