"""Local attention as LRA computes it: softmax attention inside strided groups.

LRA's "Local Attention" (``models/local/local_attention.py``, block 50 in ``local.py``). L is
padded to ``L' = L + b - L % b`` and reshaped ``[B, b, N, ...]``, ``N = L' / b``, so group n
is the strided ``{p : p mod N = n}`` and each query attends to its group's real keys::

    y_i = sum_{j = i mod N, j real} softmax_j(q_i . k_j / sqrt(d)) v_j

Scores ``[B, H, N, b, b]``, linear in L; non-causal. As N follows the padded length, real
outputs depend on how far the batch is padded (not on the pads' contents), as in LRA.
``lra_bugs`` reproduces LRA's masking (docs/lra_parity.md). Also holds block helpers shared
by ``sparse``, ``longformer`` and ``bigbird``.
"""

from __future__ import annotations

import numbers

import flax.linen as nn
import jax
import jax.numpy as jnp

from simpletron_jax.model.attention import base, registry


def check_int_field(value: int, field: str, variant: str, minimum: int = 1) -> None:
  """Raises ValueError naming ``model.attention_kwargs.<field>`` unless an int ``>= minimum``."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
    raise ValueError(f"model.attention_kwargs.{field}={value!r} must be an integer >= "
                     f"{minimum} for attention {variant!r}")


def pad_length(x: jnp.ndarray, length: int, value=0) -> jnp.ndarray:
  """Pads axis 1 of ``x`` ``[B, L, ...]`` at the end with ``value`` to ``[B, length, ...]``."""
  extra = length - x.shape[1]
  if extra == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[1] = (0, extra)
  return jnp.pad(x, widths, constant_values=value)


def to_blocks(x: jnp.ndarray, block_size: int, value=0) -> jnp.ndarray:
  """Splits ``[B, L, ...]`` into ``[B, ceil(L / b), b, ...]``, the tail padded with ``value``."""
  num_blocks = -(-x.shape[1] // block_size)
  x = pad_length(x, num_blocks * block_size, value)
  return x.reshape((x.shape[0], num_blocks, block_size) + x.shape[2:])


def with_neighbours(x_BxNxbx: jnp.ndarray) -> jnp.ndarray:
  """``[B, N, b, ...] -> [B, N, 3b, ...]``: blocks n-1, n, n+1, zeros (False) beyond the ends."""
  widths = [(0, 0)] * x_BxNxbx.ndim
  widths[1] = (1, 1)
  padded = jnp.pad(x_BxNxbx, widths)
  return jnp.concatenate([padded[:, :-2], padded[:, 1:-1], padded[:, 2:]], axis=2)


def masked_softmax(logits: jnp.ndarray, keep: jnp.ndarray, dtype: base.Dtype) -> jnp.ndarray:
  """Softmax over the last axis in float32, cast to ``dtype``; ``keep == False`` entries get 0.

  A row with nothing kept comes out uniform (finite); real queries always keep their own key.
  """
  logits = logits.astype(jnp.float32)
  logits = jnp.where(keep, logits, jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(logits, axis=-1).astype(dtype)


def scale_queries(q_BxLxHxK: jnp.ndarray) -> jnp.ndarray:
  """``q / sqrt(K)``, the scaled dot product (Vaswani et al., 2017)."""
  return q_BxLxHxK / jnp.sqrt(q_BxLxHxK.shape[-1]).astype(q_BxLxHxK.dtype)


LRA_MASK_BIAS = -1e10   # the bias LRA's attentions add at masked logits


def lra_padded_length(length: int, block_size: int) -> int:
  """LRA's padded length ``L + b - L % b``: 1 to b positions more (``local_attention.py``)."""
  return length + block_size - length % block_size


class LocalAttention(base.Attention):
  """Attention within LRA's strided groups (:class:`base.Attention`'s fields, then its own).

  Attributes:
    dropout_rate: dropout on the ``[B, H, N, b, b]`` weights.
    block_size: b (LRA: 50; its CIFAR-10 and Pathfinder configs 64).
    lra_bugs: LRA's mask: appended positions are real keys, the mask is read as contiguous
      blocks of b though the groups are strided, and it masks queries and keys with a
      ``-1e10`` bias (a row with no key is uniform over its group).

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``; softmax in float32.

  Raises:
    ValueError: ``block_size < 1`` (``model.attention_kwargs.block_size``), or bad ``qkv_dim``.
  """

  block_size: int = 50
  lra_bugs: bool = False

  @nn.compact
  def __call__(self, x_BxLxE, mask_BxL=None, *, deterministic: bool = True):
    check_int_field(self.block_size, "block_size", "local")
    batch, length = x_BxLxE.shape[:2]
    mask_BxL = base.default_mask(x_BxLxE, mask_BxL)
    b = self.block_size
    padded = lra_padded_length(length, b)
    n = padded // b
    # LRA pads the attention's input (not q, k, v): appended rows project to the biases.
    x_BxPxE = pad_length(x_BxLxE, padded)
    q, k, v = self.project_qkv(x_BxPxE)
    # Position p = i * N + g sits at [:, i, g]: group g is {p : p mod N = g}.
    q_BxbxNxHxK, k_BxbxNxHxK, v_BxbxNxHxK = (
        t.reshape((batch, b, n) + t.shape[2:]) for t in (scale_queries(q), k, v))
    logits_BxHxNxbxb = jnp.einsum("bqnhd,bknhd->bhnqk", q_BxbxNxHxK, k_BxbxNxHxK)
    if self.lra_bugs:
      # The mask cut into contiguous blocks, misaligned with the strided groups.
      real_BxNxb = pad_length(mask_BxL, padded, True).reshape(batch, n, b)
      allowed_BxNxbxb = real_BxNxb[:, :, :, None] & real_BxNxb[:, :, None, :]
      bias = jnp.where(allowed_BxNxbxb, 0.0, LRA_MASK_BIAS).astype(jnp.float32)
      logits_BxHxNxbxb = logits_BxHxNxbxb.astype(jnp.float32) + bias[:, None]
      weights_BxHxNxbxb = jax.nn.softmax(logits_BxHxNxbxb, axis=-1).astype(self.dtype)
    else:
      real_BxbxN = pad_length(mask_BxL, padded, False).reshape(batch, b, n)
      keep_BxHxNxbxb = jnp.swapaxes(real_BxbxN, 1, 2)[:, None, :, None, :]
      weights_BxHxNxbxb = masked_softmax(logits_BxHxNxbxb, keep_BxHxNxbxb, self.dtype)
    weights_BxHxNxbxb = nn.Dropout(self.dropout_rate)(weights_BxHxNxbxb,
                                                      deterministic=deterministic)
    y_BxbxNxHxK = jnp.einsum("bhnqk,bknhd->bqnhd", weights_BxHxNxbxb, v_BxbxNxHxK)
    y_BxLxHxK = y_BxbxNxHxK.reshape((batch, padded) + q.shape[2:])[:, :length]
    return self.project_out(y_BxLxHxK)


registry.register(registry.AttentionSpec(
    "local", LocalAttention, paper="LRA local attention (Tay et al., Long Range Arena, 2021)"))
