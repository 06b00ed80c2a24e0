"""The typed model config, :class:`ModelConfig` (``config.model``), with its checks, and the
closed sets of values its fields take. The encoder, its heads and the builders that read it
are in :mod:`simpletron_jax.model.encoders`; ``docs/configs.md`` lists the fields with the
variants that change them."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn
import jax.numpy as jnp
import ml_collections
from flax.core import FrozenDict

from simpletron_jax.model import attention, layers
from simpletron_jax.model.attention import base


POOLINGS = ("CLS", "MEAN")
# Classifier heads: LRA's ``common_layers.classifier_head`` (Dense(mlp_dim) -> act ->
# Dense(num_classes)), or one Dense(num_classes) on the pooled encoding (LRA's
# ``SinkhornTransformerEncoder``).
HEADS = ("mlp", "dense")
# Classifier-head activations: LRA's ReLU, or the SimpleTRON authors' torch ``nn.GELU``
# (the exact erf form).
HEAD_ACTIVATIONS = {"relu": nn.relu, "gelu": lambda x: nn.gelu(x, approximate=False)}
# Retrieval: how the two pooled documents u, v meet (LRA ``classifier_head_dual``).
INTERACTIONS = ("concat", "nli")
# The encoder's embeddings (config field model.embedding_type): LRA's, or BERT's
# (``encoders.Encoder._bert_embeddings``).
EMBEDDING_TYPES = ("lra", "bert")
# The activations' dtypes (``model.dtype``); parameters are float32.
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
_BOOLS = (False, True)
# The encoder's sizes: every config sets them, so they have no default.
SIZES = ("emb_dim", "num_heads", "qkv_dim", "mlp_dim", "num_layers", "max_length")


def _choice_field(default, choices=None):
  """A :class:`ModelConfig` field with its default and, for a closed set, its allowed
  values (checked by :meth:`ModelConfig.validate`)."""
  return dataclasses.field(default=default, metadata={"choices": choices})


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The settings of the encoder and its classifier head (``config.model``), typed.

  Built once from ``config.model`` by :meth:`from_config_dict`, which validates it
  (:meth:`validate`), and passed whole to :func:`encoders.build_classifier` /
  :func:`encoders.build_encoder` and :class:`encoders.Encoder`. The defaults are LRA's design
  choices (the correct function); LRA's bugs are options (``lra_*``), and the SimpleTRON
  authors' and BERT's choices are options too.
  ``docs/configs.md`` lists the fields with the variants that change them.

  Attributes:
    emb_dim, num_heads, qkv_dim, mlp_dim, num_layers: sizes (LRA names); positive ints,
      ``qkv_dim`` a multiple of ``num_heads``.
    max_length: longest input in tokens, excluding CLS.
    attention: registry name; see ``simpletron_jax.model.attention.names()``.
    attention_kwargs: options of ``attention`` (``AttentionSpec.options``); blocks of another
      attention (through ``attention_per_layer``) use that variant's defaults.
    attention_per_layer: one registry name per block (length ``num_layers``), or empty
      for ``attention`` in every block (the attention swaps of Chan & Ong's linear-attention
      study).
    dropout_rate, attention_dropout_rate: dropout rates in ``[0, 1)``.
    learn_pos_emb: learned (True) or sinusoidal (False) positions.
    classifier_pool: ``"CLS"`` (a learned zero-initialised token prepended,
      its final state pooled) or ``"MEAN"`` (mean over real tokens only).
    head: the classifier head, a name in :data:`HEADS`: ``"mlp"`` (LRA's
      ``common_layers.classifier_head``) or ``"dense"`` (one Dense, LRA's
      ``SinkhornTransformerEncoder``).
    head_activation: a key of :data:`HEAD_ACTIVATIONS`: ``"relu"`` (LRA) or ``"gelu"``
      (the SimpleTRON authors' ``TClassifier``).
    interaction: retrieval, how the two pooled documents meet, a name in
      :data:`INTERACTIONS` (LRA ``classifier_head_dual``).
    attention_bias: biases on the attention's query, key, value and output projections.
      False (default): LRA's ``bias=False`` (``models/transformer/transformer.py`` and every
      LRA variant); True: the SimpleTRON authors' ``nn.Linear`` layers.
    lra_mean_over_pads: with MEAN pooling, average over every position, pads included, as
      LRA's ``common_layers.classifier_head`` does (``jnp.mean(encoded, axis=1)``; a bug:
      the result depends on the padding). False (default): the mean over real tokens.
    lra_cls_mask: the CLS token takes the padding mask of the first token, as LRA's
      encoders build it (``src_padding_mask[:, :1]``, ``models/transformer/transformer.py``),
      so when the first token is a pad (a black first pixel under LRA's ``token > 0`` image
      mask) CLS is masked as a query and as a key (a bug). False (default): CLS is real.
    lra_dual_no_cls: retrieval, the encoders of LRA's ``TransformerDualEncoder``, which run
      with ``classifier=False``: no CLS is prepended and CLS pooling reads position 0, the
      first real token (:class:`encoders.Encoder` ``prepend_cls``).
    last_block_cls_only: with CLS pooling, the last block updates position 0 only (its
      attention still reads every position as keys and values; see
      :class:`layers.EncoderBlock` ``index``). The logits are those of the full
      block; only the random dropout masks of that block are drawn for the smaller shape.
      Ignored for MEAN.
    length_multiple: pads the sequence (CLS included) with masked positions at the end to a
      multiple of this (a positive int; 1: no padding, LRA) before the blocks, so that the
      matmuls need no padding of their own (docs/fast_paths.md). The outputs are unchanged:
      allowed only where every block's ``AttentionSpec.length_padding_exact`` holds (and its
      ``padding_exact_options``); dropout masks in the blocks are drawn for the longer shape.
    dtype: the activations' dtype, ``"float32"`` or ``"bfloat16"`` (parameters float32).
    pos_emb_init: learned positions' initialiser, ``"normal"`` (LRA) or ``"zeros"``
      (the SimpleTRON authors); see :class:`layers.AddPositionEmbs`.
    embedding_dropout: dropout on the embeddings (LRA, default) or none (the authors).
    attention_branch_dropout: see :class:`layers.EncoderBlock` (False: the authors).
    final_layer_norm: LayerNorm after the blocks (LRA, default); the authors' matching
      model has none.
    zero_pad_embedding: if True, token id 0 embeds to the zero vector, as the authors'
      ``nn.Embedding(padding_idx=0)`` (their pads then carry only their positions).
      Tokens only: the CLS vector is unaffected.
    mlp_activation: the block MLP's GELU, a key of :data:`layers.MLP_ACTIVATIONS`:
      ``"gelu_tanh"`` (flax's tanh approximation, LRA's; default) or ``"gelu_exact"``
      (torch's ``nn.GELU()``, the SimpleTRON authors' ``TBlock``).
    cls_position: with a prepended CLS token, True (default, LRA) prepends CLS and then adds
      positions ``0..L`` (the table has ``max_length + 1`` rows, CLS at position 0); False
      adds positions ``0..L-1`` to the tokens first and then prepends CLS, which gets no
      position (the table has ``max_length`` rows): the SimpleTRON authors' ``TEmbedding``
      (``lra/notebooks/listops_setup_simple_2.ipynb``).
    dense_init: the init of the Dense layers, a name in ``base.INITS``: ``"lra"`` (default: the
      blocks' Xavier-uniform kernels and normal(1e-6) biases, the heads' flax defaults) or
      ``"torch"`` (torch ``nn.Linear``'s kernel and bias ``U(+-1/sqrt(fan_in))`` for the
      attention's q/k/v/out projections, the block MLP and the classifier head; the
      SimpleTRON authors' code). The token embedding is N(0, 1) and the LayerNorm epsilon
      1e-6 under both, as in LRA and the authors' code.
    embedding_type: ``"lra"`` (default: the embeddings above) or ``"bert"``: BERT's
      embeddings (Devlin et al., 2019; Hugging Face ``BertEmbeddings``): the token embedding
      (initialised normal(0.02), BERT's ``initializer_range``), the positions ``0..L-1``
      (learned or sinusoidal as ``learn_pos_emb`` says; the table has ``max_positions`` rows)
      and token type 0's embedding are summed, then LayerNorm (``embed_norm``) and, with
      ``embedding_dropout``, Dropout. No CLS vector is prepended: BERT's tokenizer puts its
      ``[CLS]`` token first, and CLS pooling reads position 0. ``cls_position`` and
      ``lra_cls_mask`` do not apply.
    type_vocab_size: rows of BERT's token-type table (``token_type_embedding``; 2 in BERT;
      0: none, as the SimpleTRON authors' AG News model); an int >= 0. Every token has type
      0. BERT embeddings only.
    max_positions: rows of BERT's position table (BERT-base's 512, so that its table loads
      whole); 0: ``max_length``; else at least ``max_length``. BERT embeddings only.
    block_norm: ``"pre"`` (LRA, default) or ``"post"`` (BERT); see
      :class:`layers.EncoderBlock`.
    layer_norm_epsilon: epsilon of every LayerNorm, a positive number (LRA's and the
      authors' 1e-6, default; BERT's 1e-12).
    pooler: BERT's pooler on the pooled vector: ``tanh(Dense(E))`` (``pooler``), as Hugging
      Face ``BertPooler`` does on position 0. False (default): none.
    mlp_hidden_dropout: the Dropout after the MLP's GELU (LRA); False: none (BERT, see
      :class:`layers.MlpBlock`).

  Constructed directly (tests, embeddings-only encoders with ``num_layers=0``) it is not
  validated: call :meth:`validate`.
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
  pos_emb_init: str = _choice_field("normal", tuple(sorted(layers.POS_EMB_INITS)))
  embedding_dropout: bool = _choice_field(True, _BOOLS)
  attention_branch_dropout: bool = _choice_field(True, _BOOLS)
  final_layer_norm: bool = _choice_field(True, _BOOLS)
  zero_pad_embedding: bool = _choice_field(False, _BOOLS)
  mlp_activation: str = _choice_field("gelu_tanh", tuple(sorted(layers.MLP_ACTIVATIONS)))
  cls_position: bool = _choice_field(True, _BOOLS)
  dense_init: str = _choice_field("lra", base.INITS)
  embedding_type: str = _choice_field("lra", EMBEDDING_TYPES)
  type_vocab_size: int = 2
  max_positions: int = 0
  block_norm: str = _choice_field("pre", layers.BLOCK_NORMS)
  layer_norm_epsilon: float = layers.LN_EPSILON
  pooler: bool = _choice_field(False, _BOOLS)
  mlp_hidden_dropout: bool = _choice_field(True, _BOOLS)

  def __post_init__(self):
    object.__setattr__(self, "attention_kwargs", FrozenDict(self.attention_kwargs or {}))
    object.__setattr__(self, "attention_per_layer", tuple(self.attention_per_layer or ()))

  @classmethod
  def from_config_dict(cls, model: ml_collections.ConfigDict | Mapping[str, Any]
                       ) -> ModelConfig:
    """The typed config of ``config.model`` (a ConfigDict, references resolved, or a dict).

    A field the config lacks takes its default here (the sizes have none); every other
    reader gets the whole :class:`ModelConfig`.

    Raises:
      ValueError: one line naming ``model.<field>``: a field that is not a model option,
        a missing size, or a bad value (:meth:`validate`).
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
    """Checks every field (:meth:`from_config_dict` calls it).

    Raises:
      ValueError: one line naming the offending ``model.*`` field: a value outside its
        allowed ones (``model.classifier_pool``, ``model.head``, ``model.head_activation``,
        ``model.interaction``, ``model.dtype``, ``model.pos_emb_init``,
        ``model.mlp_activation``, ``model.dense_init``, ``model.embedding_type``,
        ``model.block_norm`` and the booleans); an unknown attention (also in
        ``model.attention_per_layer``, whose length must be ``num_layers``); non-positive
        sizes, ``qkv_dim`` not divisible by ``num_heads``, or ``qkv_dim != emb_dim`` for an
        attention without an output projection (``simple``, ``simple_res``); a dropout
        rate outside ``[0, 1)``; ``model.attention_kwargs.num_queries`` (set by the
        encoder); a ``model.type_vocab_size``, ``model.max_positions`` or
        ``model.layer_norm_epsilon`` out of range, or BERT positions shorter than
        ``model.max_length``; a ``model.length_multiple`` that is not a positive int or
        could change the function.
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
    """The attention name of each block: ``attention_per_layer`` if given, else
    ``attention`` repeated (``num_layers`` names).

    Raises:
      ValueError: if ``attention_per_layer`` is non-empty and its length is not
        ``num_layers``.
    """
    if not self.attention_per_layer:
      return (self.attention,) * self.num_layers
    if len(self.attention_per_layer) != self.num_layers:
      raise ValueError(f"model.attention_per_layer has {len(self.attention_per_layer)} names "
                       f"({list(self.attention_per_layer)}) but "
                       f"model.num_layers={self.num_layers}")
    return self.attention_per_layer

  def _validate_bert_sizes(self) -> None:
    """Raises ValueError naming ``model.type_vocab_size`` or ``model.max_positions`` when it
    is not an int >= 0, ``model.layer_norm_epsilon`` when it is not a positive number, or
    ``model.max_positions`` when BERT's position table (``embedding_type="bert"``) would be
    shorter than ``model.max_length``."""
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
    """Raises ValueError naming ``model.length_multiple`` when it is not a positive int, or
    when padding the length could change the function: a block whose attention's
    ``AttentionSpec.length_padding_exact`` is False, or ``attention_kwargs`` outside its
    ``padding_exact_options`` (Simple's published ``normalizer="padded"`` /
    ``mask_pads=False``, which let the pads in)."""
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
