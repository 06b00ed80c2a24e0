"""Local attention as LRA computes it: softmax attention inside strided groups.

The LRA "Local Attention" baseline (Tay et al., Long Range Arena, 2021; LRA
``models/local/local_attention.py``, block size 50 by default in
``models/local/local.py``). LRA's code pads the length L by ``b - L % b``
positions (1 to b, a whole block when ``L % b == 0``), so the padded length is
``L' = (L // b + 1) * b`` with ``N = L' / b`` groups, and reshapes
``[B, L', ...]`` to ``[B, b, N, ...]`` with attention over the b axis. Its
groups are therefore strided: group n holds the positions ``{p : p mod N = n}``,
and each query attends to the real keys of its own group::

    y_i = sum_{j = i mod N, j real} softmax_j(q_i . k_j / sqrt(d)) v_j

This strided grouping is LRA's design choice and the default here. With a CLS
token at position 0 (LRA's model pools CLS) CLS sees the positions ``= 0 mod N``
at every depth. Scores are ``[B, H, N, b, b]``: linear in L. Non-causal; there
is no causal form. Because N follows the padded input length, the outputs at
real positions depend on how far the batch is padded (not on what the pads
hold), as in LRA.

LRA's bugs, reproduced by ``lra_bugs=True`` (docs/lra_parity.md):

* the appended positions are padded into the mask with ``-1e9`` on a bool array,
  i.e. True: they are real keys (zero inputs, so zero keys and values without
  biases);
* the padding mask is cut into CONTIGUOUS blocks ``[B, N, b]`` while the
  queries and keys are grouped by stride, so query i and key j of group n
  (positions ``i N + n`` and ``j N + n``) are masked by the real flags of
  positions ``n b + i`` and ``n b + j``;
* the mask is LRA's query AND key mask added as a ``-1e10`` bias, so a row with
  no allowed key is uniform over the b keys of its group.

This file also holds small helpers shared by ``sparse.py``, ``longformer.py``
and ``bigbird.py``.
"""

from __future__ import annotations

import numbers

import flax.linen as nn
import jax
import jax.numpy as jnp

from simpletron_jax.model.attention import base, registry


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


LRA_MASK_BIAS = -1e10   # the bias LRA's attentions add at masked logits


def lra_padded_length(length: int, block_size: int) -> int:
  """LRA's padded length ``L + b - L % b`` (``models/local/local_attention.py``): always
  1 to b positions more than ``length``, a whole block when ``length % b == 0``."""
  return length + block_size - length % block_size


class LocalAttention(base.Attention):
  """Multi-head softmax attention within LRA's strided groups (LRA local attention).

  Fields: :class:`base.Attention`'s ``num_heads`` (H), ``qkv_dim`` (D, over all heads),
  ``out_dim`` (O), ``use_bias`` and ``dense_init`` (of the ``query``, ``key``, ``value`` and
  ``out`` projections), then ``dropout_rate``, ``dtype`` and its own options:

  Attributes:
    dropout_rate: dropout on the ``[B, H, N, b, b]`` attention weights.
    block_size: b, the size of each group (LRA: 50; its CIFAR-10 and Pathfinder configs 64).
      The length L is padded internally to ``L' = L + b - L % b`` (LRA's formula), giving
      ``N = L' / b`` groups ``{p : p mod N = n}``.
    dtype: computation dtype; the softmax is computed in float32.
    lra_bugs: reproduce LRA's masking in ``models/local/local_attention.py`` (config field
      ``model.attention_kwargs.lra_bugs``): the appended positions are real keys, the
      padding mask is read as contiguous blocks of b although the groups are strided
      (misaligned), and it masks queries as well as keys with a ``-1e10`` bias (a row with
      no allowed key is uniform over its group). False (default): each query attends to
      the real keys of its own strided group.

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``.
  Non-causal. By default the outputs at real positions do not depend on what the padded
  positions hold; they do depend on L (through N), as in LRA.

  Raises:
    ValueError: if ``block_size < 1`` (naming
      ``model.attention_kwargs.block_size``), or ``qkv_dim`` is not a multiple
      of ``num_heads``.
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
      # Appended positions real; the mask cut into contiguous blocks [B, N, b] (misaligned
      # with the strided groups), query AND key, added as a -1e10 bias.
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
