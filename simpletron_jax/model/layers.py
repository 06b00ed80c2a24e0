"""Encoder building blocks, following LRA ``models/layers/common_layers.py`` and
``models/transformer/transformer.py`` (Tay et al., 2020)."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from simpletron_jax.model import attention
from simpletron_jax.model.attention import base
from simpletron_jax.model.model_config import ModelConfig

# By the names ModelConfig allows (model_config.POS_EMB_INITS, MLP_ACTIVATIONS).
POS_EMB_INITS = {"normal": nn.initializers.normal(stddev=0.02), "zeros": nn.initializers.zeros}

def sinusoidal_table(max_len: int, dim: int) -> np.ndarray:
  """Vaswani et al.'s (2017) sin/cos position table, ``[max_len, dim]`` float32 numpy.

  Feature ``2i`` of position ``p`` is ``sin(p / 10000^(2i/dim))``, ``2i+1`` its cosine; an odd
  ``dim`` drops the last cosine.
  """
  position = np.arange(max_len, dtype=np.float64)[:, None]
  div_term = np.exp(np.arange(0, dim, 2) * -(np.log(10000.0) / dim))
  table = np.zeros((max_len, dim), dtype=np.float64)
  table[:, 0::2] = np.sin(position * div_term)
  table[:, 1::2] = np.cos(position * div_term)[:, : dim // 2]
  return table.astype(np.float32)


class AddPositionEmbs(nn.Module):
  """Adds absolute positions ``0..L-1``: ``x_BxLxE -> x_BxLxE``.

  Attributes:
    max_len: rows of the table, in tokens.
    learned: a learned table (LRA's ``learn_pos_emb``) instead of the fixed sinusoidal one.
    init: the learned table's ``"normal"`` (0.02, LRA's ``AddPositionEmbs``) or ``"zeros"``.

  Raises:
    ValueError: if ``L > max_len``, or for an unknown ``init``.
  """

  max_len: int
  learned: bool = False
  init: str = "normal"

  @nn.compact
  def __call__(self, x_BxLxE):
    length, dim = x_BxLxE.shape[1:]
    if length > self.max_len:
      raise ValueError(f"sequence of {length} positions exceeds max_len={self.max_len} "
                       "(config field model.max_length)")
    if self.init not in POS_EMB_INITS:
      raise ValueError(f"model.pos_emb_init={self.init!r}; expected one of "
                       f"{sorted(POS_EMB_INITS)}")
    if self.learned:
      table = self.param("pos_embedding", POS_EMB_INITS[self.init], (self.max_len, dim))
    else:
      table = jnp.asarray(sinusoidal_table(self.max_len, dim))
    return x_BxLxE + table[None, :length].astype(x_BxLxE.dtype)


@jax.custom_vjp
def gelu(x):
  """``nn.gelu(x)`` (tanh form; same shape and dtype) whose backward pass saves only ``x``.

  The backward pass recomputes ``tanh`` rather than keep a ``[B, L, mlp_dim]`` array; values
  and gradients equal ``nn.gelu``'s bit for bit (tested). Memory and speed: docs/fast_paths.md.
  """
  return nn.gelu(x)


def _gelu_fwd(x):
  return nn.gelu(x), x


def _gelu_bwd(x, g):
  # The barrier keeps XLA from merging (CSE) this tanh with the forward pass's.
  return jax.vjp(nn.gelu, jax.lax.optimization_barrier(x))[1](g)


gelu.defvjp(_gelu_fwd, _gelu_bwd)


def gelu_exact(x):
  """Exact GELU ``x * Phi(x)``, same shape and dtype: torch's ``nn.GELU()`` in the SimpleTRON
  authors' ``TBlock`` (``lra/notebooks/listops_setup_simple_2.ipynb``)."""
  return nn.gelu(x, approximate=False)


MLP_ACTIVATIONS = {"gelu_exact": gelu_exact, "gelu_tanh": gelu}


class MlpBlock(nn.Module):
  """Dense(mlp_dim) -> GELU -> Dropout -> Dense(E) -> Dropout (LRA ``common_layers.MlpBlock``):
  ``x_BxLxE -> x_BxLxE`` in ``config.dtype``; ``config`` is a :class:`ModelConfig`."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxE, *, deterministic: bool):
    c = self.config

    def dense(width, fan_in):
      kernel_init, bias_init = base.initializers(fan_in, c.dense_init)
      return nn.Dense(width, kernel_init=kernel_init, bias_init=bias_init, dtype=c.compute_dtype)

    y_BxLxM = MLP_ACTIVATIONS[c.mlp_activation](dense(c.mlp_dim, x_BxLxE.shape[-1])(x_BxLxE))
    if c.mlp_hidden_dropout:
      y_BxLxM = nn.Dropout(c.dropout_rate)(y_BxLxM, deterministic=deterministic)
    y_BxLxE = dense(x_BxLxE.shape[-1], c.mlp_dim)(y_BxLxM)
    return nn.Dropout(c.dropout_rate)(y_BxLxE, deterministic=deterministic)


class EncoderBlock(nn.Module):
  """One encoder block, pre-LN (LRA ``transformer.py``) or post-LN (BERT, Hugging Face
  ``BertLayer``; the SimpleTRON authors' AG News ``ag/layers.py``)::

      pre:  x1 = x0 + Dropout(Attn(LN(x0)));  out = x1 + MLP(LN(x1))
      post: x1 = LN(x0 + Dropout(Attn(x0)));  out = LN(x1 + MLP(x1))

  Simple-Res (``double_skip``) adds ``x0`` to the last sum. ``LayerNorm_0`` is the attention's
  (BERT's ``attention.output.LayerNorm``), ``LayerNorm_1`` the MLP's (``output.LayerNorm``).

  Attributes:
    config: the validated :class:`ModelConfig`.
    index: the block's place, 0-based; its attention is ``config.layer_attentions()[index]``.

  Call: ``(x_BxLxE, mask_BxL bool) -> x_BxLxE`` in ``config.dtype``; ``x_Bx1xE`` (position 0)
  from the last block under ``last_block_cls_only`` with CLS pooling.

  Raises:
    ValueError: for an unknown attention (unvalidated config).
  """

  config: ModelConfig
  index: int

  @nn.compact
  def __call__(self, x0_BxLxE, mask_BxL, *, deterministic: bool):
    c = self.config
    pre, name = c.block_norm == "pre", c.layer_attentions()[self.index]
    norm = functools.partial(nn.LayerNorm, epsilon=c.layer_norm_epsilon, dtype=c.compute_dtype)
    spec = attention.get(name)
    kwargs = dict(c.attention_kwargs) if name == c.attention else {}
    queries = int(c.last_block_cls_only and c.classifier_pool == "CLS"
                  and self.index == c.num_layers - 1)
    if queries and "num_queries" in spec.module_fields():
      kwargs["num_queries"] = queries
    y = norm()(x0_BxLxE) if pre else x0_BxLxE
    y = spec.build(num_heads=c.num_heads, qkv_dim=c.qkv_dim, out_dim=x0_BxLxE.shape[-1],
                   dropout_rate=c.attention_dropout_rate, dtype=c.compute_dtype,
                   use_bias=c.attention_bias, dense_init=c.dense_init,
                   name="attention", **kwargs)(y, mask_BxL, deterministic=deterministic)
    if queries:
      y, x0_BxLxE = y[:, :queries], x0_BxLxE[:, :queries]
    if c.attention_branch_dropout:
      y = nn.Dropout(c.dropout_rate)(y, deterministic=deterministic)
    x1_BxLxE = x0_BxLxE + y
    if pre:
      y = norm()(x1_BxLxE)
    else:
      x1_BxLxE = y = norm()(x1_BxLxE)
    out = x1_BxLxE + MlpBlock(c)(y, deterministic=deterministic)
    if spec.double_skip:
      out = out + x0_BxLxE
    return out if pre else norm()(out)
