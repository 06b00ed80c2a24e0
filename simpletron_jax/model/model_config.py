"""The typed model config, :class:`ModelConfig` (``config.model``), its checks and the closed
sets of values its fields take; :mod:`simpletron_jax.model.encoders` reads it."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn
import jax.numpy as jnp
import ml_collections
from flax.core import FrozenDict

from simpletron_jax.model import attention
from simpletron_jax.model.attention import base


POOLINGS = ("CLS", "MEAN")
HEADS = ("mlp", "dense")
HEAD_ACTIVATIONS = {"relu": nn.relu, "gelu": lambda x: nn.gelu(x, approximate=False)}
# The names of layers.py's tables (learned position inits, the block MLP's activations).
POS_EMB_INITS = ("normal", "zeros")
MLP_ACTIVATIONS = ("gelu_exact", "gelu_tanh")
BLOCK_NORMS = ("pre", "post")
LN_EPSILON = 1e-6
INTERACTIONS = ("concat", "nli")
EMBEDDING_TYPES = ("lra", "bert")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
_BOOLS = (False, True)
SIZES = ("emb_dim", "num_heads", "qkv_dim", "mlp_dim", "num_layers", "max_length")


def _choice_field(default, choices=None):
  """A field with its default and, for a closed set, its allowed values (see ``validate``)."""
  return dataclasses.field(default=default, metadata={"choices": choices})


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The settings of the encoder and its classifier head (``config.model``), typed.

  Built and validated by :meth:`from_config_dict`; constructed directly, it is not validated.
  The defaults are LRA's design choices; LRA's bugs (``lra_*``) and the choices of BERT and of
  the SimpleTRON authors ("the authors") are options. Variants that set them: docs/configs.md.

  Attributes:
    emb_dim, num_heads, qkv_dim, mlp_dim, num_layers: sizes (LRA's names), positive ints.
    max_length: longest input in tokens, excluding CLS.
    attention: attention registry name (``simpletron_jax.model.attention.names()``).
    attention_kwargs: options of ``attention``; other attentions in the blocks take defaults.
    attention_per_layer: one registry name per block; empty: ``attention`` in every block.
    dropout_rate, attention_dropout_rate: dropout rates in ``[0, 1)``.
    learn_pos_emb: learned (True) or sinusoidal (False) positions.
    classifier_pool: ``"CLS"`` (a learned zero-init token prepended) or ``"MEAN"`` (real tokens).
    head: ``"mlp"`` (LRA ``common_layers.classifier_head``) or ``"dense"`` (one Dense, Sinkhorn).
    head_activation: the head's ``"relu"`` (LRA) or exact ``"gelu"`` (the authors' TClassifier).
    interaction: retrieval's ``"concat"`` or ``"nli"`` of ``u``, ``v`` (LRA classifier_head_dual).
    attention_bias: biases on the q/k/v/out projections (the authors); False: LRA's bias=False.
    lra_mean_over_pads: LRA's bug: MEAN pooling averages over the pads too (classifier_head).
    lra_cls_mask: LRA's bug: CLS takes the first token's padding mask (LRA ``transformer.py``).
    lra_dual_no_cls: LRA's ``TransformerDualEncoder``: retrieval prepends no CLS, pools position 0.
    last_block_cls_only: with CLS pooling, the last block computes position 0 only.
    length_multiple: pad the length (CLS included) to a multiple of this; outputs unchanged.
    dtype: the activations' dtype, ``"float32"`` or ``"bfloat16"``; parameters are float32.
    pos_emb_init: learned positions' init, ``"normal"`` (LRA) or ``"zeros"`` (the authors).
    embedding_dropout: Dropout on the embeddings (LRA); False: none (the authors).
    attention_branch_dropout: Dropout on the attention branch (LRA); False: none (the authors).
    final_layer_norm: LayerNorm after the blocks (LRA); False: none (the authors).
    zero_pad_embedding: token id 0 embeds to zeros (the authors' nn.Embedding(padding_idx=0)).
    mlp_activation: the block MLP's ``"gelu_tanh"`` (flax's, LRA) or ``"gelu_exact"`` (torch's).
    cls_position: CLS at position 0 (LRA); False: CLS prepended after the positions (the authors).
    dense_init: ``"lra"`` (Xavier-uniform blocks, flax's heads) or ``"torch"`` (nn.Linear's).
    embedding_type: ``"lra"`` or ``"bert"`` (Hugging Face ``BertEmbeddings``; no CLS prepended).
    type_vocab_size: rows of BERT's token-type table (2 in BERT; 0: none); every token is type 0.
    max_positions: rows of BERT's position table (512 in BERT); 0: ``max_length``.
    block_norm: LayerNorm placement in the blocks, ``"pre"`` (LRA) or ``"post"`` (BERT).
    layer_norm_epsilon: every LayerNorm's epsilon (1e-6: LRA and the authors; 1e-12: BERT).
    pooler: BERT's pooler, ``tanh(Dense(E))`` of the pooled vector (``BertPooler``).
    mlp_hidden_dropout: Dropout after the MLP's GELU (LRA); False: none (BERT).
  """

  emb_dim: int
  num_heads: int
  qkv_dim: int
  mlp_dim: int
  num_layers: int
  max_length: int
  attention: str = "softmax"
  attention_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=FrozenDict)
  attention_per_layer: tuple[str, ...] = ()
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  learn_pos_emb: bool = _choice_field(False, _BOOLS)
  classifier_pool: str = _choice_field("CLS", POOLINGS)
  head: str = _choice_field("mlp", HEADS)
  head_activation: str = _choice_field("relu", tuple(sorted(HEAD_ACTIVATIONS)))
  interaction: str = _choice_field("concat", INTERACTIONS)
  attention_bias: bool = _choice_field(False, _BOOLS)
  lra_mean_over_pads: bool = _choice_field(False, _BOOLS)
  lra_cls_mask: bool = _choice_field(False, _BOOLS)
  lra_dual_no_cls: bool = _choice_field(False, _BOOLS)
  last_block_cls_only: bool = _choice_field(False, _BOOLS)
  length_multiple: int = 1
  dtype: str = _choice_field("float32", tuple(sorted(DTYPES)))
  pos_emb_init: str = _choice_field("normal", POS_EMB_INITS)
  embedding_dropout: bool = _choice_field(True, _BOOLS)
  attention_branch_dropout: bool = _choice_field(True, _BOOLS)
  final_layer_norm: bool = _choice_field(True, _BOOLS)
  zero_pad_embedding: bool = _choice_field(False, _BOOLS)
  mlp_activation: str = _choice_field("gelu_tanh", MLP_ACTIVATIONS)
  cls_position: bool = _choice_field(True, _BOOLS)
  dense_init: str = _choice_field("lra", base.INITS)
  embedding_type: str = _choice_field("lra", EMBEDDING_TYPES)
  type_vocab_size: int = 2
  max_positions: int = 0
  block_norm: str = _choice_field("pre", BLOCK_NORMS)
  layer_norm_epsilon: float = LN_EPSILON
  pooler: bool = _choice_field(False, _BOOLS)
  mlp_hidden_dropout: bool = _choice_field(True, _BOOLS)

  def __post_init__(self):
    object.__setattr__(self, "attention_kwargs", FrozenDict(self.attention_kwargs or {}))
    object.__setattr__(self, "attention_per_layer", tuple(self.attention_per_layer or ()))

  @classmethod
  def from_config_dict(cls, model: ml_collections.ConfigDict | Mapping[str, Any]
                       ) -> ModelConfig:
    """The validated config of ``config.model`` (ConfigDict or dict); absent fields: defaults.

    Raises:
      ValueError: naming ``model.<field>``: an unknown field, a missing size or a bad value.
    """
    values = model.to_dict() if isinstance(model, ml_collections.ConfigDict) else dict(model)
    fields = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(fields))
    if unknown:
      raise ValueError(f"model.{unknown[0]} is not a model option; the options are "
                       f"{', '.join(fields)}")
    missing = [f for f in SIZES if f not in values]
    if missing:
      raise ValueError(f"model.{missing[0]} is missing: the sizes {list(SIZES)} have no "
                       "default")
    config = cls(**values)
    config.validate()
    return config

  def validate(self) -> None:
    """Checks every field.

    Raises:
      ValueError: naming the ``model.<field>`` whose value is out of range or inconsistent.
    """
    for f in dataclasses.fields(self):
      choices = f.metadata.get("choices")
      if choices is not None and getattr(self, f.name) not in choices:
        raise ValueError(f"model.{f.name}={getattr(self, f.name)!r}; expected one of "
                         f"{list(choices)}")
    for field in SIZES:
      value = getattr(self, field)
      if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"model.{field}={value!r} must be positive (an int)")
    if self.qkv_dim % self.num_heads:
      raise ValueError(f"model.qkv_dim={self.qkv_dim} is not divisible by "
                       f"model.num_heads={self.num_heads}")
    for field in ("dropout_rate", "attention_dropout_rate"):
      rate = getattr(self, field)
      if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
        raise ValueError(f"model.{field}={rate!r} must be a number in [0, 1)")
    attention.get(self.attention)   # names model.attention when unknown
    if "num_queries" in self.attention_kwargs:
      raise ValueError("model.attention_kwargs.num_queries is set by the encoder; use "
                       "model.last_block_cls_only instead")
    names = self.layer_attentions()
    for i, name in enumerate(names):
      try:
        spec = attention.get(name)
      except ValueError as e:
        raise ValueError(f"model.attention_per_layer[{i}]: {e}") from None
      if spec.fixed_kwargs.get("use_output_proj") is False and self.qkv_dim != self.emb_dim:
        raise ValueError(
            f"attention {name!r} has no output projection, so model.qkv_dim "
            f"({self.qkv_dim}) must equal model.emb_dim ({self.emb_dim}); use "
            "'simple_resl' to decouple them")
    self._validate_bert_sizes()
    self._validate_length_multiple(names)

  @property
  def compute_dtype(self) -> Any:
    """The jnp dtype of ``dtype`` (the activations'; :data:`DTYPES`)."""
    return DTYPES[self.dtype]

  def layer_attentions(self) -> tuple[str, ...]:
    """The attention name of each block (``num_layers`` names).

    Raises:
      ValueError: if ``attention_per_layer`` is non-empty and not ``num_layers`` long.
    """
    if not self.attention_per_layer:
      return (self.attention,) * self.num_layers
    if len(self.attention_per_layer) != self.num_layers:
      raise ValueError(f"model.attention_per_layer has {len(self.attention_per_layer)} names "
                       f"({list(self.attention_per_layer)}) but "
                       f"model.num_layers={self.num_layers}")
    return self.attention_per_layer

  def _validate_bert_sizes(self) -> None:
    """Raises ValueError for a bad ``type_vocab_size``, ``max_positions`` or
    ``layer_norm_epsilon``, or a BERT position table shorter than ``max_length``."""
    for field in ("type_vocab_size", "max_positions"):
      value = getattr(self, field)
      if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"model.{field}={value!r} must be an int >= 0")
    epsilon = self.layer_norm_epsilon
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not epsilon > 0:
      raise ValueError(f"model.layer_norm_epsilon={epsilon!r} must be a positive number")
    rows = self.max_positions
    if self.embedding_type == "bert" and rows and rows < self.max_length:
      raise ValueError(f"model.max_positions={rows} is shorter than model.max_length="
                       f"{self.max_length}: BERT's position table needs a row per token "
                       "([CLS] and [SEP] included); raise it or set 0 (max_length rows)")

  def _validate_length_multiple(self, names: tuple[str, ...]) -> None:
    """Raises ValueError if ``length_multiple`` is not a positive int or padding could change
    the function (``AttentionSpec.length_padding_exact``, ``padding_exact_options``)."""
    multiple = self.length_multiple
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
      raise ValueError(f"model.length_multiple={multiple!r} must be a positive int (1: off)")
    if multiple == 1:
      return
    exact = [n for n in attention.names() if attention.get(n).length_padding_exact]
    inexact = sorted(set(names) - set(exact))
    if inexact:
      raise ValueError(f"model.length_multiple={multiple} would change what attention "
                       f"{inexact[0]!r} computes; it is exact only for {exact}")
    kwargs = dict(self.attention_kwargs)
    if attention.get(self.attention).padding_inexact_options(kwargs):
      raise ValueError(f"model.length_multiple={multiple} with model.attention_kwargs "
                       f"{kwargs} lets the padding into Simple attention; use "
                       "normalizer='real' and mask_pads=True, or length_multiple=1")
