"""The LRA encoder with a pluggable attention, following LRA
``models/transformer/transformer.py`` (TransformerEncoder) and
``models/layers/common_layers.py`` (the classifier heads). LRA's design choices are the
defaults (no attention biases, flax's default init in the heads); its bugs are options
(``model.lra_mean_over_pads``, ``model.lra_dual_no_cls``), the defaults computing the correct
function. ``docs/lra_parity.md`` lists each difference and the golden tests that check it.

BERT's encoder is a configuration of the same :class:`Encoder`, not a second model: BERT's
embeddings (``model.embedding_type="bert"``), post-LN blocks (``model.block_norm="post"``)
and the pooler (``model.pooler``), with any registered attention in place of softmax
(``docs/bert.md``; :mod:`simpletron_jax.bert_import` loads a Hugging Face checkpoint)."""

from __future__ import annotations

import json
from typing import Any, Mapping

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from simpletron_jax import attention, layers
from simpletron_jax.attention import base

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
# (``Encoder._bert_embeddings``).
EMBEDDING_TYPES = ("lra", "bert")
# BERT's ``initializer_range``: the std of its embedding tables' normal init.
BERT_INIT_STDDEV = 0.02


class Encoder(nn.Module):
  """Token embedding, optional CLS, positions, pre-LN blocks, final LN, pooling (LRA's);
  or BERT's embeddings, post-LN blocks and pooler (``embedding_type``, ``block_norm``,
  ``pooler`` below).

  Attributes:
    vocab_size: number of token ids, 0 being padding.
    emb_dim, num_heads, qkv_dim, mlp_dim, num_layers: sizes (LRA names).
    max_length: longest input in tokens, excluding CLS.
    attention: registry name; see ``simpletron_jax.attention.names()``.
    attention_per_layer: one registry name per block (length ``num_layers``), or empty
      for ``attention`` in every block (the attention swaps of Chan & Ong's linear-attention
      study).
    attention_kwargs: options of ``attention``; blocks of another attention (through
      ``attention_per_layer``) use that variant's defaults.
    dropout_rate, attention_dropout_rate: dropout rates.
    learn_pos_emb: learned (True) or sinusoidal (False) positions.
    classifier_pool: ``"CLS"`` (a learned zero-initialised token prepended,
      its final state pooled) or ``"MEAN"`` (mean over real tokens only).
    attention_bias: biases on the attention's query, key, value and output projections.
      False (default): LRA's ``bias=False`` (``models/transformer/transformer.py`` and every
      LRA variant); True: the SimpleTRON authors' ``nn.Linear`` layers, and this project's
      checkpoints from before the option existed.
    lra_mean_over_pads: with MEAN pooling, average over every position, pads included, as
      LRA's ``common_layers.classifier_head`` does (``jnp.mean(encoded, axis=1)``; a bug:
      the result depends on the padding). False (default): the mean over real tokens.
    lra_cls_mask: the CLS token takes the padding mask of the first token, as LRA's
      encoders build it (``src_padding_mask[:, :1]``, ``models/transformer/transformer.py``),
      so when the first token is a pad (a black first pixel under LRA's ``token > 0`` image
      mask) CLS is masked as a query and as a key (a bug). False (default): CLS is real.
    prepend_cls: with CLS pooling, prepend the CLS token (default). False pools position 0,
      the first real token, with no CLS: LRA's ``TransformerDualEncoder``, whose encoders
      run with ``classifier=False`` (config field ``model.lra_dual_no_cls``).
    pos_emb_init: learned positions' initialiser, ``"normal"`` (LRA) or ``"zeros"``
      (the SimpleTRON authors); see :class:`layers.AddPositionEmbs`.
    embedding_dropout: dropout on the embeddings (LRA, default) or none (the authors).
    attention_branch_dropout: see :class:`layers.EncoderBlock` (False: the authors).
    final_layer_norm: LayerNorm after the blocks (LRA, default); the authors' matching
      model has none.
    zero_pad_embedding: if True, token id 0 embeds to the zero vector, as the authors'
      ``nn.Embedding(padding_idx=0)`` (their pads then carry only their positions).
      Tokens only: the CLS vector is unaffected.
    last_block_cls_only: with CLS pooling, the last block updates position 0 only (its
      attention still reads every position as keys and values; see
      :class:`layers.EncoderBlock` ``num_queries``). The logits are those of the full
      block; only the random dropout masks of that block are drawn for the smaller shape.
      Saves the last block's MLP and residual work on L - 1 positions. Ignored for MEAN.
    length_multiple: pads the sequence (CLS included) with masked positions at the end to a
      multiple of this before the blocks. LRA's lengths with CLS are odd (2001, 4001, 1025),
      and on Ampere and newer GPUs XLA pads both matrix dimensions of each bfloat16 cuBLAS
      matmul to a multiple of 8 (``CublasPadForGemms``) in every step instead. The outputs
      are unchanged (allowed only for the attentions in :data:`LENGTH_PADDING_EXACT`, see
      :func:`validate_model_config`); dropout masks in the blocks are drawn for the longer
      shape. 1: no padding (LRA).
    dropout_mask_bits: random bits per element of the embedding, residual and MLP dropout
      masks: 32 (flax ``nn.Dropout``, default) or 16 (:class:`layers.PackedDropout`: half
      the threefry hashes, the rate quantised to ``2**-16``).
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
      ``[CLS]`` token first, and CLS pooling reads position 0. ``prepend_cls``,
      ``cls_position`` and ``lra_cls_mask`` do not apply.
    type_vocab_size: rows of BERT's token-type table (``token_type_embedding``; 2 in BERT;
      0: none, as the SimpleTRON authors' AG News model). Every token has type 0. BERT
      embeddings only.
    max_positions: rows of BERT's position table (BERT-base's 512, so that its table loads
      whole); 0: ``max_length``. BERT embeddings only.
    block_norm: ``"pre"`` (LRA, default) or ``"post"`` (BERT); see
      :class:`layers.EncoderBlock`.
    layer_norm_epsilon: epsilon of every LayerNorm (LRA's and the authors' 1e-6, default;
      BERT's 1e-12).
    pooler: BERT's pooler on the pooled vector: ``tanh(Dense(E))`` (``pooler``), as Hugging
      Face ``BertPooler`` does on position 0. False (default): none.
    mlp_hidden_dropout: see :class:`layers.MlpBlock` ``hidden_dropout`` (False: BERT).
    return_states: False (default): the pooled ``[B, E]`` encoding. True: the per-token
      states ``[B, L, E]`` float32 after the blocks (and ``encoder_norm``), one per input
      token: the prepended CLS and the ``length_multiple`` padding are cut off, and the
      pooling and ``pooler`` are not applied (their parameters are not created). For the
      language-model heads of self-pretraining (:mod:`simpletron_jax.pretraining`).

  Call: ``(tokens_BxL int, mask_BxL bool | None, deterministic) -> [B, E]``
  float32 (``[B, L, E]`` with ``return_states``). ``mask_BxL`` defaults to
  ``tokens_BxL > 0``; image tasks pass an explicit all-True mask because pixel value 0 is
  real.

  Raises:
    ValueError: naming ``model.embedding_type`` for an unknown value, or
      ``model.max_length`` when the input is longer than the position table.
  """

  vocab_size: int
  emb_dim: int
  num_heads: int
  qkv_dim: int
  mlp_dim: int
  num_layers: int
  max_length: int
  attention: str = "softmax"
  attention_per_layer: tuple[str, ...] = ()
  attention_kwargs: Mapping[str, Any] | None = None
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  learn_pos_emb: bool = False
  classifier_pool: str = "CLS"
  attention_bias: bool = False
  lra_mean_over_pads: bool = False
  lra_cls_mask: bool = False
  prepend_cls: bool = True
  pos_emb_init: str = "normal"
  embedding_dropout: bool = True
  attention_branch_dropout: bool = True
  final_layer_norm: bool = True
  zero_pad_embedding: bool = False
  last_block_cls_only: bool = False
  length_multiple: int = 1
  dropout_mask_bits: int = 32
  mlp_activation: str = "gelu_tanh"
  cls_position: bool = True
  dense_init: str = "lra"
  embedding_type: str = "lra"
  type_vocab_size: int = 2
  max_positions: int = 0
  block_norm: str = "pre"
  layer_norm_epsilon: float = layers.LN_EPSILON
  pooler: bool = False
  mlp_hidden_dropout: bool = True
  return_states: bool = False
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, tokens_BxL, mask_BxL=None, *, deterministic: bool = True):
    if mask_BxL is None:
      mask_BxL = tokens_BxL > 0
    mask_BxL = mask_BxL.astype(bool)
    if self.embedding_type not in EMBEDDING_TYPES:
      raise ValueError(f"model.embedding_type={self.embedding_type!r}; expected one of "
                       f"{list(EMBEDDING_TYPES)}")
    if self.embedding_type == "bert":
      x_BxLxE = self._bert_embeddings(tokens_BxL, deterministic)
    else:
      x_BxLxE = nn.Embed(self.vocab_size, self.emb_dim,
                         embedding_init=nn.initializers.normal(stddev=1.0),
                         name="embed")(tokens_BxL.astype(jnp.int32))
      if self.zero_pad_embedding:
        x_BxLxE = x_BxLxE * (tokens_BxL != 0)[..., None].astype(x_BxLxE.dtype)
      with_cls = self.classifier_pool == "CLS" and self.prepend_cls
      positions = layers.AddPositionEmbs(
          self.max_length + int(with_cls and self.cls_position), learned=self.learn_pos_emb,
          init=self.pos_emb_init, name="posembed")
      if not (with_cls and self.cls_position):   # the authors' order: positions, then CLS
        x_BxLxE = positions(x_BxLxE)
      if with_cls:
        cls_1x1xE = self.param("cls", nn.initializers.zeros, (1, 1, self.emb_dim))
        cls_Bx1xE = jnp.broadcast_to(cls_1x1xE, (x_BxLxE.shape[0], 1, self.emb_dim))
        x_BxLxE = jnp.concatenate([cls_Bx1xE, x_BxLxE], axis=1)
        cls_mask_Bx1 = (mask_BxL[:, :1] if self.lra_cls_mask
                        else jnp.ones_like(mask_BxL[:, :1]))
        mask_BxL = jnp.concatenate([cls_mask_Bx1, mask_BxL], axis=1)
        if self.cls_position:   # LRA's order: CLS at position 0
          x_BxLxE = positions(x_BxLxE)
      if self.embedding_dropout:
        x_BxLxE = layers.dropout(self.dropout_rate, self.dropout_mask_bits)(
            x_BxLxE, deterministic=deterministic)
    x_BxLxE = x_BxLxE.astype(self.dtype)
    pad = -x_BxLxE.shape[1] % self.length_multiple
    if pad:   # masked positions at the end, which every allowed attention ignores
      x_BxLxE = jnp.pad(x_BxLxE, ((0, 0), (0, pad), (0, 0)))
      mask_BxL = jnp.pad(mask_BxL, ((0, 0), (0, pad)))
    names = layer_attentions(self.attention, self.attention_per_layer, self.num_layers)
    for i in range(self.num_layers):
      x_BxLxE = layers.EncoderBlock(
          attention=names[i],
          attention_kwargs=self.attention_kwargs if names[i] == self.attention else None,
          num_heads=self.num_heads, qkv_dim=self.qkv_dim, mlp_dim=self.mlp_dim,
          dropout_rate=self.dropout_rate,
          attention_dropout_rate=self.attention_dropout_rate, dtype=self.dtype,
          attention_branch_dropout=self.attention_branch_dropout,
          dropout_mask_bits=self.dropout_mask_bits, num_queries=self._block_queries(i),
          attention_bias=self.attention_bias, mlp_activation=self.mlp_activation,
          dense_init=self.dense_init, block_norm=self.block_norm,
          layer_norm_epsilon=self.layer_norm_epsilon,
          mlp_hidden_dropout=self.mlp_hidden_dropout, name=f"encoderblock_{i}")(
              x_BxLxE, mask_BxL, deterministic=deterministic)
    if self.final_layer_norm:
      x_BxLxE = nn.LayerNorm(epsilon=self.layer_norm_epsilon, dtype=self.dtype,
                             name="encoder_norm")(x_BxLxE)
    x_BxLxE = x_BxLxE.astype(jnp.float32)
    if self.return_states:   # one state per input token: no CLS, no length padding
      start = int(self.embedding_type != "bert" and self.classifier_pool == "CLS"
                  and self.prepend_cls)
      return x_BxLxE[:, start:start + tokens_BxL.shape[1]]
    if self.classifier_pool == "CLS":
      pooled_BxE = x_BxLxE[:, 0]
    elif self.lra_mean_over_pads:   # LRA's bug, an option: the input's pads count
      pooled_BxE = x_BxLxE[:, :x_BxLxE.shape[1] - pad].mean(1)
    else:
      m_BxLx1 = mask_BxL[..., None].astype(jnp.float32)
      pooled_BxE = (x_BxLxE * m_BxLx1).sum(1) / jnp.maximum(m_BxLx1.sum(1), 1.0)
    if self.pooler:   # BERT's BertPooler: tanh(Dense(E)) of the pooled state
      kernel_init, bias_init = base.initializers(self.emb_dim, self.dense_init)
      pooled_BxE = jnp.tanh(nn.Dense(self.emb_dim, kernel_init=kernel_init,
                                     bias_init=bias_init, name="pooler")(pooled_BxE))
    return pooled_BxE

  def _bert_embeddings(self, tokens_BxL, deterministic: bool):
    """BERT's embeddings (``embedding_type="bert"``, Hugging Face ``BertEmbeddings`` with
    token type 0): ``Dropout(LN(embed[t] + pos[0..L-1] + token_type[0]))`` -> ``[B, L, E]``
    float32. Called from the compact ``__call__``, so its parameters are the encoder's
    (``embed``, ``posembed``, ``token_type_embedding``, ``embed_norm``)."""
    init = nn.initializers.normal(stddev=BERT_INIT_STDDEV)
    x_BxLxE = nn.Embed(self.vocab_size, self.emb_dim, embedding_init=init,
                       name="embed")(tokens_BxL.astype(jnp.int32))
    if self.zero_pad_embedding:
      x_BxLxE = x_BxLxE * (tokens_BxL != 0)[..., None].astype(x_BxLxE.dtype)
    x_BxLxE = layers.AddPositionEmbs(self.max_positions or self.max_length,
                                     learned=self.learn_pos_emb, init=self.pos_emb_init,
                                     name="posembed")(x_BxLxE)
    if self.type_vocab_size:
      types_TxE = self.param("token_type_embedding", init,
                             (self.type_vocab_size, self.emb_dim))
      x_BxLxE = x_BxLxE + types_TxE[0]
    x_BxLxE = nn.LayerNorm(epsilon=self.layer_norm_epsilon, name="embed_norm")(x_BxLxE)
    if self.embedding_dropout:
      x_BxLxE = layers.dropout(self.dropout_rate, self.dropout_mask_bits)(
          x_BxLxE, deterministic=deterministic)
    return x_BxLxE

  def _block_queries(self, i: int) -> int:
    """Positions block ``i`` updates: 1 (CLS) for the last block with
    ``last_block_cls_only`` and CLS pooling, else 0 (all)."""
    cls_only = self.last_block_cls_only and self.classifier_pool == "CLS"
    return 1 if cls_only and i == self.num_layers - 1 else 0


def _head_dense(width: int, name: str, init: str, x_BxF):
  """A classifier-head Dense(width) on ``x_BxF`` (float ``[B, F]``) -> ``[B, width]``.

  ``init="lra"``: flax's defaults, LeCun-normal kernel and zero bias, as LRA's heads
  (``nn.Dense`` without initialisers); ``"torch"``: torch ``nn.Linear``'s
  (``base.initializers``), as the SimpleTRON authors' ``TClassifier`` / ``DualClassifier``.
  Call it inside a compact method.
  """
  if init == "torch":
    kernel_init, bias_init = base.initializers(x_BxF.shape[-1], init)
    return nn.Dense(width, kernel_init=kernel_init, bias_init=bias_init, name=name)(x_BxF)
  return nn.Dense(width, name=name)(x_BxF)


class ClassificationEncoder(nn.Module):
  """Encoder plus LRA's classifier head (``common_layers.classifier_head``):
  Dense(mlp_dim) -> ReLU -> Dense(num_classes).

  The head's Dense layers have flax's default init, LeCun-normal kernels and zero biases,
  as LRA's (``nn.Dense`` without initialisers), or torch's under
  ``encoder.dense_init="torch"`` (the SimpleTRON authors' ``TClassifier``).

  Attributes:
    encoder: the :class:`Encoder` settings.
    num_classes: number of labels.
    head_activation: a key of :data:`HEAD_ACTIVATIONS`: ``"relu"`` (LRA) or ``"gelu"``
      (the SimpleTRON authors' ``TClassifier``).
    head: a name in :data:`HEADS`: ``"mlp"`` (default, the layers above) or ``"dense"``
      (one Dense(num_classes), LRA's ``SinkhornTransformerEncoder``).

  Call: ``(tokens_BxL, mask_BxL | None, deterministic) -> logits_BxC`` float32.
  """

  encoder: Encoder
  num_classes: int
  head_activation: str = "relu"
  head: str = "mlp"

  @nn.compact
  def __call__(self, tokens_BxL, mask_BxL=None, *, deterministic: bool = True):
    h_BxF = self.encoder(tokens_BxL, mask_BxL, deterministic=deterministic)
    init = self.encoder.dense_init
    if self.head == "mlp":
      h_BxF = HEAD_ACTIVATIONS[self.head_activation](
          _head_dense(self.encoder.mlp_dim, "head_hidden", init, h_BxF))
    return _head_dense(self.num_classes, "head_logits", init, h_BxF)


class DualEncoderClassifier(nn.Module):
  """LRA's matching model: one shared encoder for both documents and a two-layer head.

  Follows LRA ``models/transformer/transformer.py`` (``TransformerDualEncoder``) with
  ``models/layers/common_layers.py`` ``classifier_head_dual``: the pooled encodings ``u``,
  ``v`` of the two documents are combined by ``interaction`` and fed to Dense(mlp_dim) ->
  act -> Dense(mlp_dim // 2) -> act -> Dense(num_classes), with flax's default init (as
  LRA's; torch's under ``encoder.dense_init="torch"``, the SimpleTRON authors'
  ``DualClassifier`` in ``lra/notebooks/bpe_matching_setup_simple_2.ipynb``). LRA's
  encoders here have no CLS token: see :attr:`Encoder.prepend_cls`.

  Attributes:
    encoder: the :class:`Encoder` settings, shared by both documents.
    num_classes: number of labels.
    interaction: ``"concat"`` (default): ``[u, v]`` (``[B, 2E]``), what LRA's code ran
      (``interaction=None``) and the SimpleTRON authors' ``DualClassifier``; ``"nli"``:
      ``[u, v, u * v, u - v]`` (``[B, 4E]``), the LRA paper's text.
    head_activation: a key of :data:`HEAD_ACTIVATIONS` (ReLU in LRA and the authors).

  Call: ``(tokens1_BxL, mask1_BxL | None, tokens2_BxL2, mask2_BxL2 | None,
  deterministic) -> logits_BxC`` float32. ``L`` and ``L2`` may differ.

  Raises:
    ValueError: if ``tokens2_BxL2`` is missing.
  """

  encoder: Encoder
  num_classes: int
  interaction: str = "concat"
  head_activation: str = "relu"

  @nn.compact
  def __call__(self, tokens1_BxL, mask1_BxL=None, tokens2_BxL=None, mask2_BxL=None, *,
               deterministic: bool = True):
    if tokens2_BxL is None:
      raise ValueError("the dual encoder needs two documents (batch keys inputs and inputs2)")
    u_BxE = self.encoder(tokens1_BxL, mask1_BxL, deterministic=deterministic)
    v_BxE = self.encoder(tokens2_BxL, mask2_BxL, deterministic=deterministic)
    parts = [u_BxE, v_BxE]
    if self.interaction == "nli":
      parts += [u_BxE * v_BxE, u_BxE - v_BxE]
    h_BxF = jnp.concatenate(parts, axis=-1)
    init = self.encoder.dense_init
    for name, width in (("head_hidden", self.encoder.mlp_dim),
                        ("head_hidden2", self.encoder.mlp_dim // 2)):
      h_BxF = HEAD_ACTIVATIONS[self.head_activation](_head_dense(width, name, init, h_BxF))
    return _head_dense(self.num_classes, "head_logits", init, h_BxF)


_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def layer_attentions(attention_name: str, per_layer, num_layers: int) -> tuple[str, ...]:
  """The attention name of each block: ``per_layer`` if given, else ``attention_name`` repeated.

  Args:
    attention_name: ``model.attention``.
    per_layer: ``model.attention_per_layer``, a sequence of names or empty/None.
    num_layers: ``model.num_layers``.

  Returns:
    A tuple of ``num_layers`` registry names.

  Raises:
    ValueError: if ``per_layer`` is non-empty and its length is not ``num_layers``.
  """
  if not per_layer:
    return (attention_name,) * num_layers
  if len(per_layer) != num_layers:
    raise ValueError(f"model.attention_per_layer has {len(per_layer)} names "
                     f"({list(per_layer)}) but model.num_layers={num_layers}")
  return tuple(per_layer)


def validate_model_config(model: ml_collections.ConfigDict) -> None:
  """Checks ``config.model`` before anything is built.

  Raises:
    ValueError: naming the offending ``model.*`` field: an unknown attention or
      pooling or dtype, non-positive sizes, ``qkv_dim`` not divisible by
      ``num_heads``, ``qkv_dim != emb_dim`` for an attention without an
      output projection (``simple``, ``simple_res``), or a ``model.attention_per_layer``
      whose length is not ``num_layers`` or that holds an unknown name; an unknown
      ``model.head_activation``, ``model.interaction``, ``model.pos_emb_init``,
      ``model.dropout_mask_bits``, ``model.mlp_activation``, ``model.cls_position``,
      ``model.dense_init``, ``model.embedding_type``, ``model.block_norm``, ``model.pooler``
      or ``model.mlp_hidden_dropout``; a ``model.type_vocab_size``, ``model.max_positions``
      or ``model.layer_norm_epsilon`` out of range, or BERT positions shorter than
      ``model.max_length``; a
      ``model.length_multiple`` that is not a positive int or could change the function.
  """
  _validate_choices(model)
  spec = attention.get(model.attention)
  for field in ("emb_dim", "num_heads", "qkv_dim", "mlp_dim", "num_layers", "max_length"):
    if int(model[field]) <= 0:
      raise ValueError(f"model.{field}={model[field]} must be positive")
  if model.qkv_dim % model.num_heads:
    raise ValueError(f"model.qkv_dim={model.qkv_dim} is not divisible by "
                     f"model.num_heads={model.num_heads}")
  if model.classifier_pool not in POOLINGS:
    raise ValueError(f"model.classifier_pool={model.classifier_pool!r}; expected one of "
                     f"{POOLINGS}")
  if model.dtype not in _DTYPES:
    raise ValueError(f"model.dtype={model.dtype!r}; expected one of {sorted(_DTYPES)}")
  if "num_queries" in (model.get("attention_kwargs") or {}):
    raise ValueError("model.attention_kwargs.num_queries is set by the encoder; use "
                     "model.last_block_cls_only instead")
  names = layer_attentions(model.attention, model.get("attention_per_layer", ()),
                           model.num_layers)
  for i, name in enumerate(names):
    try:
      spec = attention.get(name)
    except ValueError as e:
      raise ValueError(f"model.attention_per_layer[{i}]: {e}") from None
    if spec.fixed_kwargs.get("use_output_proj") is False and model.qkv_dim != model.emb_dim:
      raise ValueError(
          f"attention {name!r} has no output projection, so model.qkv_dim "
          f"({model.qkv_dim}) must equal model.emb_dim ({model.emb_dim}); use "
          "'simple_resl' to decouple them")
  _check_length_multiple(model, names)


# Attentions whose output at a real position is a masked sum over all keys, so masked
# positions appended after the last token change nothing (model.length_multiple). Attentions
# with blocks, chunks, hashing or random blocks laid out over the length, or with weights sized
# by max_length, are left out.
LENGTH_PADDING_EXACT = ("softmax", "simple", "simple_res", "simple_resl", "linear", "performer",
                        "aft_simple")


def _check_length_multiple(model: ml_collections.ConfigDict, names: tuple[str, ...]) -> None:
  """Raises ValueError naming ``model.length_multiple`` when it is not a positive int, or when
  padding the length could change the function (an attention outside
  :data:`LENGTH_PADDING_EXACT`, or Simple's published ``normalizer="padded"`` /
  ``mask_pads=False``, which let the pads in)."""
  multiple = _option(model, "length_multiple")
  if not isinstance(multiple, int) or multiple < 1:
    raise ValueError(f"model.length_multiple={multiple!r} must be a positive int (1: off)")
  if multiple == 1:
    return
  inexact = sorted(set(names) - set(LENGTH_PADDING_EXACT))
  if inexact:
    raise ValueError(f"model.length_multiple={multiple} would change what attention "
                     f"{inexact[0]!r} computes; it is exact only for "
                     f"{list(LENGTH_PADDING_EXACT)}")
  kwargs = dict(model.get("attention_kwargs") or {})
  if model.attention.startswith("simple") and (kwargs.get("normalizer", "real") != "real"
                                               or not kwargs.get("mask_pads", True)):
    raise ValueError(f"model.length_multiple={multiple} with model.attention_kwargs "
                     f"{kwargs} lets the padding into Simple attention; use "
                     "normalizer='real' and mask_pads=True, or length_multiple=1")


# Model options of config.model with their defaults (LRA's function); configs that predate
# them build as before.
OPTION_DEFAULTS = {"pos_emb_init": "normal", "embedding_dropout": True,
                   "attention_branch_dropout": True, "final_layer_norm": True,
                   "zero_pad_embedding": False, "head_activation": "relu",
                   "interaction": "concat", "last_block_cls_only": False,
                   "length_multiple": 1, "dropout_mask_bits": 32, "attention_bias": False,
                   "lra_mean_over_pads": False, "lra_dual_no_cls": False, "lra_cls_mask": False,
                   "head": "mlp", "mlp_activation": "gelu_tanh", "cls_position": True,
                   "dense_init": "lra", "embedding_type": "lra", "type_vocab_size": 2,
                   "max_positions": 0, "block_norm": "pre",
                   "layer_norm_epsilon": layers.LN_EPSILON, "pooler": False,
                   "mlp_hidden_dropout": True}


def with_option_defaults(model_config: Mapping[str, Any]) -> dict[str, Any]:
  """A ``config.model`` dict with :data:`OPTION_DEFAULTS` filled in where it lacks an
  option, and ``attention_kwargs`` with the options of ``model.attention`` it lacks at their
  module defaults (``AttentionSpec.options``, as JSON), so a config that leaves an option out
  matches one that sets it to its default. An unknown attention name gets no attention
  defaults (the model validation names it)."""
  out = {**OPTION_DEFAULTS, **model_config}
  try:
    spec = attention.get(out.get("attention", ""))
  except ValueError:
    return out
  defaults = json.loads(json.dumps(spec.options(), default=str))
  out["attention_kwargs"] = {**defaults, **(out.get("attention_kwargs") or {})}
  return out


def _option(model: ml_collections.ConfigDict, field: str):
  """``model.<field>``, or its :data:`OPTION_DEFAULTS` value when the config lacks it."""
  return model.get(field, OPTION_DEFAULTS[field])


def _validate_choices(model: ml_collections.ConfigDict) -> None:
  """Raises ValueError naming ``model.head_activation``, ``model.interaction``,
  ``model.head``, ``model.attention_bias``, ``model.lra_mean_over_pads``,
  ``model.lra_dual_no_cls``, ``model.lra_cls_mask``, ``model.pos_emb_init``,
  ``model.dropout_mask_bits``, ``model.mlp_activation``, ``model.cls_position``,
  ``model.dense_init``, ``model.embedding_type``, ``model.block_norm``, ``model.pooler`` or
  ``model.mlp_hidden_dropout`` when it is not one of the known choices, and see
  :func:`_validate_bert_sizes`."""
  for field, choices in (("head_activation", sorted(HEAD_ACTIVATIONS)),
                         ("interaction", list(INTERACTIONS)), ("head", list(HEADS)),
                         ("attention_bias", [False, True]),
                         ("lra_mean_over_pads", [False, True]),
                         ("lra_dual_no_cls", [False, True]),
                         ("lra_cls_mask", [False, True]),
                         ("pos_emb_init", sorted(layers.POS_EMB_INITS)),
                         ("dropout_mask_bits", list(layers.DROPOUT_MASK_BITS)),
                         ("mlp_activation", sorted(layers.MLP_ACTIVATIONS)),
                         ("cls_position", [False, True]),
                         ("dense_init", list(base.INITS)),
                         ("embedding_type", list(EMBEDDING_TYPES)),
                         ("block_norm", list(layers.BLOCK_NORMS)),
                         ("pooler", [False, True]),
                         ("mlp_hidden_dropout", [False, True])):
    if _option(model, field) not in choices:
      raise ValueError(f"model.{field}={_option(model, field)!r}; expected one of {choices}")
  _validate_bert_sizes(model)


def _validate_bert_sizes(model: ml_collections.ConfigDict) -> None:
  """Raises ValueError naming ``model.type_vocab_size`` or ``model.max_positions`` when it
  is not an int >= 0, ``model.layer_norm_epsilon`` when it is not a positive number, or
  ``model.max_positions`` when BERT's position table (``embedding_type="bert"``) would be
  shorter than ``model.max_length``."""
  for field in ("type_vocab_size", "max_positions"):
    value = _option(model, field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
      raise ValueError(f"model.{field}={value!r} must be an int >= 0")
  epsilon = _option(model, "layer_norm_epsilon")
  if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not epsilon > 0:
    raise ValueError(f"model.layer_norm_epsilon={epsilon!r} must be a positive number")
  rows = _option(model, "max_positions")
  if _option(model, "embedding_type") == "bert" and rows and rows < model.max_length:
    raise ValueError(f"model.max_positions={rows} is shorter than model.max_length="
                     f"{model.max_length}: BERT's position table needs a row per token "
                     "([CLS] and [SEP] included); raise it or set 0 (max_length rows)")


def build_classifier(model: ml_collections.ConfigDict, *, vocab_size: int,
                     num_classes: int, dual: bool = False) -> nn.Module:
  """Builds the classifier from ``config.model`` after :func:`validate_model_config`.

  Args:
    model: the ``config.model`` ConfigDict (fields as in ``configs/``).
    vocab_size: token ids in ``[0, vocab_size)``.
    num_classes: number of labels.
    dual: build LRA's two-document :class:`DualEncoderClassifier` (retrieval).

  Returns:
    An unbound :class:`ClassificationEncoder`, or :class:`DualEncoderClassifier` when
    ``dual``.

  Raises:
    ValueError: see :func:`validate_model_config`.
  """
  validate_model_config(model)
  encoder = build_encoder(model, vocab_size=vocab_size, dual=dual)
  head_activation = _option(model, "head_activation")
  if dual:
    return DualEncoderClassifier(encoder=encoder, num_classes=num_classes,
                                 interaction=_option(model, "interaction"),
                                 head_activation=head_activation)
  return ClassificationEncoder(encoder=encoder, num_classes=num_classes,
                               head_activation=head_activation, head=_option(model, "head"))


def build_encoder(model: ml_collections.ConfigDict, *, vocab_size: int, dual: bool = False,
                  return_states: bool = False) -> Encoder:
  """The unbound :class:`Encoder` of ``config.model`` (call :func:`validate_model_config`
  first): the encoder of :func:`build_classifier`, or with ``return_states`` the same
  encoder returning per-token states (``[B, L, E]``; self-pretraining's LM heads,
  :mod:`simpletron_jax.pretraining`). ``vocab_size``: token ids in ``[0, vocab_size)``;
  ``dual``: the retrieval encoder (``model.lra_dual_no_cls`` applies)."""
  return Encoder(
      vocab_size=vocab_size, emb_dim=model.emb_dim, num_heads=model.num_heads,
      qkv_dim=model.qkv_dim, mlp_dim=model.mlp_dim, num_layers=model.num_layers,
      max_length=model.max_length, attention=model.attention,
      attention_per_layer=tuple(model.get("attention_per_layer", ()) or ()),
      attention_kwargs=dict(model.get("attention_kwargs", {}) or {}),
      dropout_rate=model.dropout_rate, attention_dropout_rate=model.attention_dropout_rate,
      learn_pos_emb=model.learn_pos_emb, classifier_pool=model.classifier_pool,
      dtype=_DTYPES[model.dtype],
      prepend_cls=not (dual and _option(model, "lra_dual_no_cls")),
      **{f: _option(model, f) for f in ("pos_emb_init", "embedding_dropout",
                                        "attention_branch_dropout", "final_layer_norm",
                                        "zero_pad_embedding", "last_block_cls_only",
                                        "length_multiple", "dropout_mask_bits",
                                        "attention_bias", "lra_mean_over_pads",
                                        "lra_cls_mask", "mlp_activation", "cls_position",
                                        "dense_init", "embedding_type", "type_vocab_size",
                                        "max_positions", "block_norm",
                                        "layer_norm_epsilon", "pooler",
                                        "mlp_hidden_dropout")},
      return_states=return_states)
