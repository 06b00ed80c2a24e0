"""Local (block) attention: softmax attention inside non-overlapping blocks.

The LRA "Local Attention" baseline (Tay et al., Long Range Arena, 2021; LRA
``models/local/local_attention.py``, block size 50 in ``models/local/local.py``).
The sequence is cut into contiguous blocks of ``block_size`` tokens (the
length is padded internally up to a multiple of the block size) and each
query attends only to the real keys of its own block::

    y_i = sum_{j in block(i), j real} softmax_j(q_i . k_j / sqrt(d)) v_j

Scores are ``[B, H, L/b, b, b]``: linear in L. Non-causal (LRA uses it
bidirectionally); there is no causal form.

Differences from LRA's code:

* LRA reshapes ``[B, L, ...]`` to ``[B, block_size, L / block_size, ...]`` and
  attends over the ``block_size`` axis, so its "blocks" are actually the
  strided sets ``{p : p mod (L / b) = r}``. Here blocks are contiguous, as the
  LRA paper describes local attention.
* Blocks never exchange information, at any depth: with CLS pooling
  (``model.classifier_pool = "CLS"``) the classifier sees only the first
  ``block_size - 1`` tokens. Use MEAN pooling with this variant.

This file also holds small helpers shared by ``sparse.py``, ``longformer.py``
and ``bigbird.py``.
"""

from __future__ import annotations

import numbers

import flax.linen as nn
import jax
import jax.numpy as jnp

from simpletron_jax.attention import base


def check_int_field(value: int, field: str, variant: str, minimum: int = 1) -> None:
  """Raises ValueError unless ``value`` is an int ``>= minimum``.

  The message names the config field ``model.attention_kwargs.<field>``.
  """
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
    raise ValueError(f"model.attention_kwargs.{field}={value!r} must be an integer >= "
                     f"{minimum} for attention {variant!r}")


def pad_length(x: jnp.ndarray, length: int, value=0) -> jnp.ndarray:
  """Pads axis 1 of ``x`` (``[B, L, ...]``) at the end up to ``length``.

  Args:
    x: ``[B, L, ...]`` array.
    length: target length, ``>= L``.
    value: fill value (``False`` for masks).

  Returns:
    ``[B, length, ...]``, same dtype.
  """
  extra = length - x.shape[1]
  if extra == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[1] = (0, extra)
  return jnp.pad(x, widths, constant_values=value)


def to_blocks(x: jnp.ndarray, block_size: int, value=0) -> jnp.ndarray:
  """Pads axis 1 up to a multiple of ``block_size`` and splits it into blocks.

  Args:
    x: ``[B, L, ...]``.
    block_size: b, positive.
    value: fill value for the padded tail.

  Returns:
    ``[B, ceil(L / b), b, ...]``; position ``p`` is at ``[:, p // b, p % b]``.
  """
  num_blocks = -(-x.shape[1] // block_size)
  x = pad_length(x, num_blocks * block_size, value)
  return x.reshape((x.shape[0], num_blocks, block_size) + x.shape[2:])


def with_neighbours(x_BxNxbx: jnp.ndarray) -> jnp.ndarray:
  """Concatenates every block with its two neighbours.

  Args:
    x_BxNxbx: ``[B, N, b, ...]`` blocks (from :func:`to_blocks`).

  Returns:
    ``[B, N, 3b, ...]``: for block n, blocks n-1, n, n+1 in order, with zeros
    (``False`` for bool) in place of the missing blocks -1 and N.
  """
  widths = [(0, 0)] * x_BxNxbx.ndim
  widths[1] = (1, 1)
  padded = jnp.pad(x_BxNxbx, widths)
  return jnp.concatenate([padded[:, :-2], padded[:, 1:-1], padded[:, 2:]], axis=2)


def masked_softmax(logits: jnp.ndarray, keep: jnp.ndarray, dtype: base.Dtype) -> jnp.ndarray:
  """Softmax over the last axis in float32, with ``keep == False`` entries at zero weight.

  A row with no kept entry comes out uniform (finite); callers only read rows
  of real queries, which always keep at least their own key.

  Args:
    logits: scores, any float dtype.
    keep: bool, broadcastable to ``logits``.
    dtype: dtype of the returned weights.

  Returns:
    Weights of ``logits``'s shape in ``dtype``.
  """
  logits = logits.astype(jnp.float32)
  logits = jnp.where(keep, logits, jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(logits, axis=-1).astype(dtype)


def scale_queries(q_BxLxHxK: jnp.ndarray) -> jnp.ndarray:
  """Returns ``q / sqrt(K)``, the scaled dot-product factor of Vaswani et al. (2017)."""
  return q_BxLxHxK / jnp.sqrt(q_BxLxHxK.shape[-1]).astype(q_BxLxHxK.dtype)


class LocalAttention(nn.Module):
  """Multi-head softmax attention within non-overlapping blocks (LRA local attention).

  Attributes:
    num_heads: H.
    qkv_dim: D, total width of queries, keys and values over all heads.
    out_dim: O, width of the output projection.
    dropout_rate: dropout on the ``[B, H, L/b, b, b]`` attention weights.
    block_size: b, tokens per block (LRA: 50). The length is padded
      internally to a multiple of b; padded keys get zero weight.
    dtype: computation dtype; the softmax is computed in float32.
    use_bias: biases on the query, key, value and output projections (config field
      ``model.attention_bias``; LRA's attentions have none, see :func:`base.head_projection`).

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``.
  Non-causal; outputs at real positions do not depend on padding.

  Raises:
    ValueError: if ``block_size < 1`` (naming
      ``model.attention_kwargs.block_size``), or ``qkv_dim`` is not a multiple
      of ``num_heads``.
  """

  num_heads: int
  qkv_dim: int
  out_dim: int
  dropout_rate: float = 0.0
  block_size: int = 50
  dtype: base.Dtype = jnp.float32
  use_bias: bool = True

  @nn.compact
  def __call__(self, x_BxLxE, mask_BxL=None, *, deterministic: bool = True):
    check_int_field(self.block_size, "block_size", "local")
    length = x_BxLxE.shape[1]
    mask_BxL = base.default_mask(x_BxLxE, mask_BxL)
    q, k, v = base.project_qkv(x_BxLxE, self.num_heads, self.qkv_dim, self.dtype,
                               use_bias=self.use_bias)
    b = self.block_size
    q_BxNxbxHxK = to_blocks(scale_queries(q), b)
    k_BxNxbxHxK = to_blocks(k, b)
    v_BxNxbxHxK = to_blocks(v, b)
    real_BxNxb = to_blocks(mask_BxL, b, False)

    logits_BxHxNxbxb = jnp.einsum("bnqhd,bnkhd->bhnqk", q_BxNxbxHxK, k_BxNxbxHxK)
    weights_BxHxNxbxb = masked_softmax(logits_BxHxNxbxb, real_BxNxb[:, None, :, None, :],
                                       self.dtype)
    weights_BxHxNxbxb = nn.Dropout(self.dropout_rate)(weights_BxHxNxbxb,
                                                      deterministic=deterministic)
    y_BxNxbxHxK = jnp.einsum("bhnqk,bnkhd->bnqhd", weights_BxHxNxbxb, v_BxNxbxHxK)
    y_BxLxHxK = y_BxNxbxHxK.reshape((x_BxLxE.shape[0], -1) + y_BxNxbxHxK.shape[3:])[:, :length]
    return base.output_projection(y_BxLxHxK, self.out_dim, self.dtype, use_bias=self.use_bias)
