"""Encoder building blocks, following LRA ``models/layers/common_layers.py`` and
``models/transformer/transformer.py`` (Tay et al., 2020)."""

from __future__ import annotations

from typing import Any, Mapping

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from simpletron_jax import attention
from simpletron_jax.attention.base import BIAS_INIT, KERNEL_INIT

LN_EPSILON = 1e-6


def sinusoidal_table(max_len: int, dim: int) -> np.ndarray:
  """The fixed sin/cos position table of Vaswani et al. (2017).

  Even feature ``2i`` of position ``p`` is ``sin(p / 10000^(2i/dim))``, odd
  feature ``2i+1`` the matching cosine.

  Args:
    max_len: number of positions.
    dim: feature width (odd widths drop the last cosine).

  Returns:
    ``[max_len, dim]`` float32 numpy array.
  """
  position = np.arange(max_len, dtype=np.float64)[:, None]
  div_term = np.exp(np.arange(0, dim, 2) * -(np.log(10000.0) / dim))
  table = np.zeros((max_len, dim), dtype=np.float64)
  table[:, 0::2] = np.sin(position * div_term)
  table[:, 1::2] = np.cos(position * div_term)[:, : dim // 2]
  return table.astype(np.float32)


class AddPositionEmbs(nn.Module):
  """Adds sinusoidal or learned absolute position embeddings.

  Attributes:
    max_len: positions available, in tokens (``max_length + 1`` with CLS).
    learned: learned table initialised normal(0.02) (SimpleTRON, LRA
      ``learn_pos_emb``) instead of the fixed sinusoidal one (LRA default).

  Call: ``x_BxLxE -> x_BxLxE`` with positions ``0..L-1`` added.

  Raises:
    ValueError: if ``L > max_len``.
  """

  max_len: int
  learned: bool = False

  @nn.compact
  def __call__(self, x_BxLxE):
    length, dim = x_BxLxE.shape[1:]
    if length > self.max_len:
      raise ValueError(f"sequence of {length} positions exceeds max_len={self.max_len} "
                       "(config field model.max_length)")
    if self.learned:
      table = self.param("pos_embedding", nn.initializers.normal(stddev=0.02),
                         (self.max_len, dim))
    else:
      table = jnp.asarray(sinusoidal_table(self.max_len, dim))
    return x_BxLxE + table[None, :length].astype(x_BxLxE.dtype)


class MlpBlock(nn.Module):
  """Dense(mlp_dim) -> GELU -> Dropout -> Dense(out_dim) -> Dropout.

  Call: ``x_BxLxE -> [B, L, out_dim]`` (``out_dim`` defaults to E).
  """

  mlp_dim: int
  out_dim: int | None = None
  dropout_rate: float = 0.1
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, *, deterministic: bool):
    out_dim = self.out_dim or x.shape[-1]
    y = nn.Dense(self.mlp_dim, kernel_init=KERNEL_INIT, bias_init=BIAS_INIT,
                 dtype=self.dtype)(x)
    y = nn.gelu(y)
    y = nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)
    y = nn.Dense(out_dim, kernel_init=KERNEL_INIT, bias_init=BIAS_INIT, dtype=self.dtype)(y)
    return nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)


class EncoderBlock(nn.Module):
  """One pre-LN encoder block::

      x1 = x0 + Dropout(Attn(LN(x0)))
      out = x1 + MLP(LN(x1))            (+ x0 for SimpleTRON's Simple-Res)

  Attributes:
    attention: registry name of the attention variant.
    attention_kwargs: variant options (``config.model.attention_kwargs``).
    num_heads, qkv_dim, mlp_dim: sizes.
    dropout_rate: residual and MLP dropout.
    attention_dropout_rate: dropout inside attention.
    dtype: computation dtype.

  Call: ``(x_BxLxE, mask_BxL, deterministic) -> x_BxLxE``.
  """

  attention: str
  num_heads: int
  qkv_dim: int
  mlp_dim: int
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  attention_kwargs: Mapping[str, Any] | None = None
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x0_BxLxE, mask_BxL, *, deterministic: bool):
    spec = attention.get(self.attention)
    emb_dim = x0_BxLxE.shape[-1]
    y = nn.LayerNorm(epsilon=LN_EPSILON, dtype=self.dtype)(x0_BxLxE)
    y = spec.build(num_heads=self.num_heads, qkv_dim=self.qkv_dim, out_dim=emb_dim,
                   dropout_rate=self.attention_dropout_rate, dtype=self.dtype,
                   name="attention", **dict(self.attention_kwargs or {}))(
                       y, mask_BxL, deterministic=deterministic)
    y = nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)
    x1_BxLxE = x0_BxLxE + y
    y = nn.LayerNorm(epsilon=LN_EPSILON, dtype=self.dtype)(x1_BxLxE)
    y = MlpBlock(self.mlp_dim, dropout_rate=self.dropout_rate, dtype=self.dtype)(
        y, deterministic=deterministic)
    out = x1_BxLxE + y
    if spec.double_skip:
      out = out + x0_BxLxE
    return out
