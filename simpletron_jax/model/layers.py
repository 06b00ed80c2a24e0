"""Encoder building blocks, following LRA ``models/layers/common_layers.py`` and
``models/transformer/transformer.py`` (Tay et al., 2020)."""

from __future__ import annotations

from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from simpletron_jax.model import attention
from simpletron_jax.model.attention import base

LN_EPSILON = 1e-6
POS_EMB_INITS = {"normal": nn.initializers.normal(stddev=0.02), "zeros": nn.initializers.zeros}

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
    learned: learned table (SimpleTRON, LRA ``learn_pos_emb``) instead of the fixed
      sinusoidal one (LRA default).
    init: initialiser of the learned table: ``"normal"`` (normal(0.02), as LRA's
      ``AddPositionEmbs``) or ``"zeros"`` (the SimpleTRON authors' ``TEmbedding``).

  Call: ``x_BxLxE -> x_BxLxE`` with positions ``0..L-1`` added.

  Raises:
    ValueError: if ``L > max_len``, or for an unknown ``init`` (config field
      ``model.pos_emb_init``).
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
  """Flax's (tanh-approximate) GELU, whose gradient saves only its input.

  Differentiated as it is, ``nn.gelu`` keeps its ``tanh`` for the backward pass: one more
  ``[B, L, mlp_dim]`` array written in the forward pass and read in the backward one (XLA
  fuses the rest). Here the backward pass recomputes ``tanh`` from ``x``, which it reads
  anyway. The values and gradients are those of ``nn.gelu`` (bit for bit on CPU, float32 and
  bfloat16; tested). Its effect on memory and speed: docs/fast_paths.md.

  Args:
    x: any float array.

  Returns:
    ``nn.gelu(x)``, same shape and dtype.
  """
  return nn.gelu(x)


def _gelu_fwd(x):
  return nn.gelu(x), x


def _gelu_bwd(x, g):
  # The barrier keeps XLA from merging this tanh with the forward pass's (CSE), which would
  # bring the saved tanh back.
  return jax.vjp(nn.gelu, jax.lax.optimization_barrier(x))[1](g)


gelu.defvjp(_gelu_fwd, _gelu_bwd)


def gelu_exact(x):
  """The exact GELU ``x * Phi(x)`` (erf form): torch's ``nn.GELU()``, which the
  SimpleTRON authors' block MLP uses (``lra/notebooks/listops_setup_simple_2.ipynb``,
  ``TBlock``).

  Args:
    x: any float array.

  Returns:
    ``nn.gelu(x, approximate=False)``, same shape and dtype.
  """
  return nn.gelu(x, approximate=False)


# The block MLP's activation (config field model.mlp_activation): flax's tanh approximation
# (LRA's ``nn.gelu``, default) or the exact erf form (the SimpleTRON authors' torch code).
MLP_ACTIVATIONS = {"gelu_tanh": gelu, "gelu_exact": gelu_exact}


class MlpBlock(nn.Module):
  """Dense(mlp_dim) -> GELU -> Dropout -> Dense(out_dim) -> Dropout.

  Attributes:
    mlp_dim, out_dim: widths (``out_dim`` defaults to E).
    dropout_rate: both Dropouts' rate.
    hidden_dropout: the Dropout after the GELU (LRA, default); False leaves it out, as BERT's
      ``BertIntermediate`` (Devlin et al., 2019; Hugging Face ``modeling_bert.py``), whose only
      MLP dropout follows the second Dense (``model.mlp_hidden_dropout``).
    activation: a key of :data:`MLP_ACTIVATIONS`: ``"gelu_tanh"`` (LRA, default) or
      ``"gelu_exact"`` (the SimpleTRON authors' ``nn.GELU()``; config ``model.mlp_activation``).
    dense_init: the Dense layers' init, a name in ``base.INITS``: ``"lra"`` (Xavier-uniform,
      normal(1e-6) biases, LRA's) or ``"torch"`` (``nn.Linear``'s; ``model.dense_init``).
    dtype: computation dtype.

  Call: ``x_BxLxE -> [B, L, out_dim]``.

  Raises:
    ValueError: naming ``model.mlp_activation`` or ``model.dense_init`` for an unknown value.
  """

  mlp_dim: int
  out_dim: int | None = None
  dropout_rate: float = 0.1
  activation: str = "gelu_tanh"
  dense_init: str = "lra"
  hidden_dropout: bool = True
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x_BxLxE, *, deterministic: bool):
    if self.activation not in MLP_ACTIVATIONS:
      raise ValueError(f"model.mlp_activation={self.activation!r}; expected one of "
                       f"{sorted(MLP_ACTIVATIONS)}")
    out_dim = self.out_dim or x_BxLxE.shape[-1]
    kernel_init, bias_init = base.initializers(x_BxLxE.shape[-1], self.dense_init)
    y_BxLxM = nn.Dense(self.mlp_dim, kernel_init=kernel_init, bias_init=bias_init,
                       dtype=self.dtype)(x_BxLxE)
    y_BxLxM = MLP_ACTIVATIONS[self.activation](y_BxLxM)
    if self.hidden_dropout:
      y_BxLxM = nn.Dropout(self.dropout_rate)(
          y_BxLxM, deterministic=deterministic)
    kernel_init, bias_init = base.initializers(self.mlp_dim, self.dense_init)
    y_BxLxO = nn.Dense(out_dim, kernel_init=kernel_init, bias_init=bias_init,
                       dtype=self.dtype)(y_BxLxM)
    return nn.Dropout(self.dropout_rate)(
        y_BxLxO, deterministic=deterministic)


def _block_mlp(block: "EncoderBlock") -> MlpBlock:
  """The MLP of ``block`` (a submodule of it, ``MlpBlock_0``, when made inside its compact
  call). A function, not a method: flax records what every module method returns, and a
  module is not an array."""
  return MlpBlock(block.mlp_dim, dropout_rate=block.dropout_rate,
                  activation=block.mlp_activation,
                  dense_init=block.dense_init, hidden_dropout=block.mlp_hidden_dropout,
                  dtype=block.dtype)


def _block_layer_norm(block: "EncoderBlock") -> nn.LayerNorm:
  """A new LayerNorm of ``block`` (``LayerNorm_<i>``, numbered in the order made inside its
  compact call); a function for the reason :func:`_block_mlp` is."""
  return nn.LayerNorm(epsilon=block.layer_norm_epsilon, dtype=block.dtype)


# Where an encoder block puts its LayerNorms (config field model.block_norm): "pre" (LRA's, on
# each branch's input) or "post" (BERT's, after each residual sum).
BLOCK_NORMS = ("pre", "post")


class EncoderBlock(nn.Module):
  """One encoder block, pre-LN (LRA, default)::

      x1 = x0 + Dropout(Attn(LN(x0)))
      out = x1 + MLP(LN(x1))            (+ x0 for SimpleTRON's Simple-Res)

  or post-LN (``block_norm="post"``: BERT, Devlin et al. 2019, Hugging Face ``BertLayer``;
  the SimpleTRON authors' AG News blocks, ``ag/layers.py``)::

      x1 = LN(x0 + Dropout(Attn(x0)))
      out = LN(x1 + MLP(x1))            (LN(x1 + MLP(x1) + x0) for Simple-Res)

  The parameter paths are the same in both: ``LayerNorm_0`` is the attention's LayerNorm
  (BERT's ``attention.output.LayerNorm``), ``LayerNorm_1`` the MLP's (``output.LayerNorm``).

  Attributes:
    attention: registry name of the attention variant.
    attention_kwargs: variant options (``config.model.attention_kwargs``).
    num_heads, qkv_dim, mlp_dim: sizes.
    dropout_rate: residual and MLP dropout.
    attention_dropout_rate: dropout inside attention.
    attention_branch_dropout: True (default, LRA) applies ``Dropout`` to the attention
      branch as above; False leaves it out (the SimpleTRON authors' ``TBlock``).
    attention_bias: biases on the attention's projections (``model.attention_bias``; LRA's
      have none).
    mlp_activation: the MLP's GELU, see :class:`MlpBlock` (``model.mlp_activation``).
    dense_init: ``"lra"`` or ``"torch"`` (``model.dense_init``): the MLP's Dense layers, and
      the attention's projections made through ``base.head_projection`` /
      ``base.output_projection`` (passed to the variant, ``AttentionSpec.build``); other
      variant-specific weights keep their own init.
    block_norm: ``"pre"`` (default) or ``"post"``, see above (``model.block_norm``).
    layer_norm_epsilon: the LayerNorms' epsilon (``model.layer_norm_epsilon``; LRA's 1e-6,
      BERT's 1e-12).
    mlp_hidden_dropout: see :class:`MlpBlock` ``hidden_dropout`` (``model.mlp_hidden_dropout``).
    num_queries: 0 (default): every position. N > 0: only the first N positions are
      updated and returned, ``[B, N, E]``: attention still reads every position as keys
      and values, while the residuals, the second LayerNorm and the MLP run on N
      positions (the last block under CLS pooling, which reads position 0 only). Variants
      with a ``num_queries`` field compute only N query rows; the others compute every
      row and slice, so the output is exact for every variant.
    dtype: computation dtype.

  Call: ``(x_BxLxE, mask_BxL, deterministic) -> x_BxLxE`` (``[B, N, E]`` with
  ``num_queries``).

  Raises:
    ValueError: naming ``model.block_norm`` for a value outside :data:`BLOCK_NORMS`.
  """

  attention: str
  num_heads: int
  qkv_dim: int
  mlp_dim: int
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  attention_kwargs: Mapping[str, Any] | None = None
  attention_branch_dropout: bool = True
  num_queries: int = 0
  attention_bias: bool = False
  mlp_activation: str = "gelu_tanh"
  dense_init: str = "lra"
  block_norm: str = "pre"
  layer_norm_epsilon: float = LN_EPSILON
  mlp_hidden_dropout: bool = True
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x0_BxLxE, mask_BxL, *, deterministic: bool):
    if self.block_norm not in BLOCK_NORMS:
      raise ValueError(f"model.block_norm={self.block_norm!r}; expected one of "
                       f"{list(BLOCK_NORMS)}")
    pre = self.block_norm == "pre"
    spec = attention.get(self.attention)
    kwargs = dict(self.attention_kwargs or {})
    if self.num_queries and "num_queries" in spec.module_fields():
      kwargs["num_queries"] = self.num_queries
    y = _block_layer_norm(self)(x0_BxLxE) if pre else x0_BxLxE
    y = spec.build(num_heads=self.num_heads, qkv_dim=self.qkv_dim, out_dim=x0_BxLxE.shape[-1],
                   dropout_rate=self.attention_dropout_rate, dtype=self.dtype,
                   use_bias=self.attention_bias, dense_init=self.dense_init,
                   name="attention", **kwargs)(y, mask_BxL, deterministic=deterministic)
    if self.num_queries:
      y, x0_BxLxE = y[:, :self.num_queries], x0_BxLxE[:, :self.num_queries]
    if self.attention_branch_dropout:
      y = nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)
    x1_BxLxE = x0_BxLxE + y
    if pre:
      y = _block_layer_norm(self)(x1_BxLxE)
    else:   # BERT: LayerNorm_0 after the attention's residual sum, LayerNorm_1 after the MLP's
      x1_BxLxE = y = _block_layer_norm(self)(x1_BxLxE)
    out = x1_BxLxE + _block_mlp(self)(y, deterministic=deterministic)
    if spec.double_skip:
      out = out + x0_BxLxE
    return out if pre else _block_layer_norm(self)(out)
