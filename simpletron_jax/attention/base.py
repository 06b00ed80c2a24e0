"""Pieces shared by the attention modules: projections, initialisers and masks.

All attention modules in this package share one call (DESIGN.md section 2)::

    y_BxLxO = Attention(num_heads=H, qkv_dim=D, out_dim=O, ...)(x_BxLxE, mask_BxL,
                                                                deterministic=True)

``mask_BxL`` is bool with True for a real token. The initialisers follow LRA
``models/transformer/transformer.py``: Xavier-uniform kernels and normal(1e-6)
biases.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

KERNEL_INIT = nn.initializers.xavier_uniform()
BIAS_INIT = nn.initializers.normal(stddev=1e-6)

Dtype = Any


def check_head_dims(qkv_dim: int, num_heads: int) -> int:
  """Returns the per-head width ``qkv_dim // num_heads``.

  Raises:
    ValueError: if ``qkv_dim`` is not a positive multiple of ``num_heads``;
      the message names the config fields ``model.qkv_dim`` and
      ``model.num_heads``.
  """
  if num_heads <= 0 or qkv_dim <= 0 or qkv_dim % num_heads:
    raise ValueError(
        f"model.qkv_dim={qkv_dim} must be a positive multiple of "
        f"model.num_heads={num_heads}")
  return qkv_dim // num_heads


def project_qkv(x_BxLxE: jnp.ndarray, num_heads: int, qkv_dim: int,
                dtype: Dtype) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
  """Projects the input to per-head queries, keys and values.

  Must be called inside a compact module method: it creates the submodules
  ``query``, ``key`` and ``value`` (``DenseGeneral`` to ``(H, D/H)``, with
  bias), so checkpoints of every variant share these parameter names.

  Args:
    x_BxLxE: ``[B, L, E]`` float input.
    num_heads: H.
    qkv_dim: D, the total query/key/value width over all heads.
    dtype: computation dtype.

  Returns:
    ``(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK)`` with ``K = D // H``.
  """
  return tuple(head_projection(x_BxLxE, num_heads, qkv_dim, dtype, name)
               for name in ("query", "key", "value"))


def head_projection(x_BxLxE: jnp.ndarray, num_heads: int, qkv_dim: int, dtype: Dtype,
                    name: str) -> jnp.ndarray:
  """One per-head projection (``DenseGeneral`` to ``(H, D/H)``, with bias) named ``name``.

  For variants that need only some of ``query``/``key``/``value`` (Reformer's shared QK,
  the Synthesizer's values); call it inside a compact module method.

  Args:
    x_BxLxE: ``[B, L, E]`` float input.
    num_heads: H.
    qkv_dim: D, the total width over all heads.
    dtype: computation dtype.
    name: the submodule name, e.g. ``"value"``.

  Returns:
    ``[B, L, H, D // H]``.

  Raises:
    ValueError: see :func:`check_head_dims`.
  """
  head_dim = check_head_dims(qkv_dim, num_heads)
  return nn.DenseGeneral(features=(num_heads, head_dim), kernel_init=KERNEL_INIT,
                         bias_init=BIAS_INIT, dtype=dtype, name=name)(x_BxLxE)


def check_max_length(variant: str, length: int, max_length: int) -> None:
  """Checks the input length against a variant's length-sized parameters.

  Args:
    variant: the registry name, for the message.
    length: tokens in the input (CLS included).
    max_length: the module's ``max_length`` field.

  Raises:
    ValueError: if ``length > max_length``; the message names
      ``model.attention_kwargs.max_length`` and says to set it to ``model.max_length + 1``.
  """
  if length > max_length:
    raise ValueError(
        f"{variant} got length {length} > model.attention_kwargs.max_length={max_length}; "
        "set model.attention_kwargs.max_length to model.max_length + 1")


def output_projection(y_BxLxHxK: jnp.ndarray, out_dim: int, dtype: Dtype) -> jnp.ndarray:
  """Merges heads with a learned ``DenseGeneral`` named ``out``.

  Args:
    y_BxLxHxK: per-head outputs.
    out_dim: O.
    dtype: computation dtype.

  Returns:
    ``[B, L, O]``.
  """
  return nn.DenseGeneral(features=out_dim, axis=(-2, -1), kernel_init=KERNEL_INIT,
                         bias_init=BIAS_INIT, dtype=dtype, name="out")(y_BxLxHxK)


def default_mask(x_BxLxE: jnp.ndarray, mask_BxL: jnp.ndarray | None) -> jnp.ndarray:
  """Returns ``mask_BxL`` as bool, or all True when it is None."""
  if mask_BxL is None:
    return jnp.ones(x_BxLxE.shape[:2], dtype=bool)
  return mask_BxL.astype(bool)


def lra_mask(mask_BxL: jnp.ndarray, lra_masking: bool) -> jnp.ndarray:
  """The key mask a variant uses: ``mask_BxL``, or with ``lra_masking`` all True.

  LRA's linear, Performer and Linformer attentions never apply the padding mask
  (DESIGN.md section 7), so their pads act as keys; ``lra_masking=True`` (config field
  ``model.attention_kwargs.lra_masking``) reproduces that.

  Args:
    mask_BxL: bool ``[B, L]``, True for real tokens.
    lra_masking: reproduce LRA's missing mask.

  Returns:
    bool ``[B, L]``.
  """
  return jnp.ones_like(mask_BxL) if lra_masking else mask_BxL
