"""Finiteness checks, and a state's CRC and layout that checkpoints carry, so a run does not
fail silently and a damaged checkpoint is never restored (docs/faults.md)."""

from __future__ import annotations

import hashlib
import zlib
from typing import Any, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np


@jax.jit
def _all_finite(leaves):
  flags = [jnp.all(jnp.isfinite(x)) for x in leaves]
  return jnp.all(jnp.stack(flags)) if flags else jnp.asarray(True)


def tree_is_finite(tree: Any) -> bool:
  """True when every floating-point leaf of ``tree`` is finite (no NaN or inf): host leaves
  (numpy, Python floats) by numpy, device arrays by one compiled check without a copy."""
  leaves = [x for x in jax.tree_util.tree_leaves(tree)
            if jnp.issubdtype(x.dtype if hasattr(x, "dtype") else np.result_type(x),
                              jnp.inexact)]
  on_device = [x for x in leaves if isinstance(x, jax.Array)]
  return (all(np.isfinite(x).all() for x in leaves if not isinstance(x, jax.Array))
          and (not on_device or bool(_all_finite(on_device))))


def first_nonfinite(records: Iterable[tuple[int, Mapping[str, Any]]],
                    keys: tuple[str, ...] = ("loss", "grad_norm")) -> tuple[int, dict] | None:
  """The first ``(step, {key: value})`` whose values are not all finite, else None.

  Args:
    records: ``(optimizer step, metrics)`` pairs in step order; metric values are scalars
      or arrays (every element is checked).
    keys: the metrics to check.
  """
  for step, metrics in records:
    values = {k: np.asarray(metrics[k]) for k in keys if k in metrics}
    if not all(np.all(np.isfinite(v)) for v in values.values()):
      return step, {k: float(v.reshape(-1)[0]) for k, v in values.items()}
  return None


def state_crc32(tree: Any, crc: int = 0) -> int:
  """CRC-32 of every leaf's shape, dtype and bytes, in tree order (host copies).

  ``crc``: the CRC of what comes before (``state_crc32((a, b)) == state_crc32(b,
  state_crc32(a))``), so one pass gives a part's CRC and the whole's."""
  for leaf in jax.tree_util.tree_leaves(jax.device_get(tree)):
    array = np.ascontiguousarray(np.asarray(leaf))
    crc = zlib.crc32(f"{array.shape}{array.dtype}".encode(), crc)
    crc = zlib.crc32(array.tobytes(), crc)
  return crc


def state_structure(tree: Any) -> str:
  """SHA-1 (hex) of every leaf's key path, shape and dtype (arrays or ``ShapeDtypeStruct``s).

  Two train states share it exactly when a checkpoint of one restores into the other: the
  optimizer's wrappers (``grad_accum_steps > 1``, ``grad_clip_norm > 0``, ``freeze``, LoRA)
  each change it."""
  digest = hashlib.sha1()
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if not hasattr(leaf, "dtype"):   # a Python scalar
      leaf = np.asarray(leaf)
    digest.update(f"{jax.tree_util.keystr(path)} {tuple(leaf.shape)} {np.dtype(leaf.dtype)}\n"
                  .encode())
  return digest.hexdigest()
