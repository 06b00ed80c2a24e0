"""LoRA adapters (Hu et al., 2021, "LoRA: Low-Rank Adaptation of Large Language Models") as a
transform of the parameter tree; the linen modules are unchanged.

A targeted kernel ``W``, viewed as ``[n_in, n_out]``, gets ``A`` (``[n_in, r]``, normal with std
``1/sqrt(n_in)``) and ``B`` (``[r, n_out]``, zeros); the model runs with
``W_eff = W + (alpha / r) * reshape(A @ B, W.shape)``, the base model at initialisation. An
attention ``out`` kernel ``[H, K, E]`` is viewed as ``[H*K, E]``, every other kernel
(``query``/``key``/``value`` ``[E, H, K]``, ``Dense`` ``[in, out]``) as its first axis against
the rest. The trainable tree is ``{"base": params, "lora": adapters}``; freezing ``base/``
trains the adapters only (Chan & Ong's re-alignment: rank 32 on W_q, W_k, W_v and W_o).
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
    ValueError: if a pattern (``lora.targets``) matches no path; it lists the kernel paths.
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
  """Adapters ``{path...: {"a": [n_in, r], "b": [r, n_out]}}``, float32, for the kernels of
  ``params`` that ``targets`` match; ``rng`` draws the ``A`` factors, ``B`` is zero.

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
  """``wrapped["base"]`` (a tree made by :func:`wrap`) with ``scale * A @ B`` (``scale`` is
  ``alpha / rank``) added to every adapted kernel, cast to the kernel's dtype."""
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
