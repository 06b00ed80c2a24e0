"""The LRA encoder with a pluggable attention, following LRA
``models/transformer/transformer.py`` (TransformerEncoder) and
``models/layers/common_layers.py`` (the classifier heads). LRA's design choices are the
defaults (no attention biases, flax's default init in the heads); its bugs are options
(``model.lra_mean_over_pads``, ``model.lra_dual_no_cls``), the defaults computing the correct
function. ``docs/lra_parity.md`` lists each difference and the golden tests that check it.

BERT's encoder is a configuration of the same :class:`Encoder`, not a second model: BERT's
embeddings (``model.embedding_type="bert"``), post-LN blocks (``model.block_norm="post"``)
and the pooler (``model.pooler``), with any registered attention in place of softmax
(``docs/bert.md``; :mod:`simpletron_jax.tools.bert_import` loads a Hugging Face checkpoint).

The typed config every class here reads, :class:`ModelConfig`, and its checks are in
:mod:`simpletron_jax.model.model_config`; ``encoders.ModelConfig`` is the same class."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from simpletron_jax.model import layers
from simpletron_jax.model.attention import base
from simpletron_jax.model.model_config import HEAD_ACTIVATIONS, ModelConfig

# BERT's ``initializer_range``: the std of its embedding tables' normal init.
BERT_INIT_STDDEV = 0.02


class Encoder(nn.Module):
  """Token embedding, optional CLS, positions, pre-LN blocks, final LN, pooling (LRA's);
  or BERT's embeddings, post-LN blocks and pooler (``config.embedding_type``,
  ``config.block_norm``, ``config.pooler``).

  Attributes:
    config: the :class:`ModelConfig` (every setting; see its fields).
    vocab_size: number of token ids, 0 being padding.
    prepend_cls: with CLS pooling, prepend the CLS token (default). False pools position 0,
      the first real token, with no CLS: LRA's ``TransformerDualEncoder``, whose encoders
      run with ``classifier=False`` (``config.lra_dual_no_cls``, :func:`build_encoder`).
    return_states: False (default): the pooled ``[B, E]`` encoding. True: the per-token
      states ``[B, L, E]`` float32 after the blocks (and ``encoder_norm``), one per input
      token: the prepended CLS and the ``length_multiple`` padding are cut off, and the
      pooling and ``pooler`` are not applied (their parameters are not created). For the
      language-model heads of self-pretraining (:mod:`simpletron_jax.train.pretraining`).

  Call: ``(tokens_BxL int, mask_BxL bool | None, deterministic) -> [B, E]``
  float32 (``[B, L, E]`` with ``return_states``), computed in ``config.dtype``.
  ``mask_BxL`` defaults to ``tokens_BxL > 0``; image tasks pass an explicit all-True mask
  because pixel value 0 is real.

  Raises:
    ValueError: naming ``model.max_length`` when the input is longer than the position
      table.
  """

  config: ModelConfig
  vocab_size: int
  prepend_cls: bool = True
  return_states: bool = False

  @nn.compact
  def __call__(self, tokens_BxL, mask_BxL=None, *, deterministic: bool = True):
    c = self.config
    if mask_BxL is None:
      mask_BxL = tokens_BxL > 0
    mask_BxL = mask_BxL.astype(bool)
    if c.embedding_type == "bert":
      x_BxLxE = self._bert_embeddings(tokens_BxL, deterministic)
    else:
      x_BxLxE = nn.Embed(self.vocab_size, c.emb_dim,
                         embedding_init=nn.initializers.normal(stddev=1.0),
                         name="embed")(tokens_BxL.astype(jnp.int32))
      if c.zero_pad_embedding:
        x_BxLxE = x_BxLxE * (tokens_BxL != 0)[..., None].astype(x_BxLxE.dtype)
      with_cls = c.classifier_pool == "CLS" and self.prepend_cls
      positions = layers.AddPositionEmbs(
          c.max_length + int(with_cls and c.cls_position), learned=c.learn_pos_emb,
          init=c.pos_emb_init, name="posembed")
      if not (with_cls and c.cls_position):   # the authors' order: positions, then CLS
        x_BxLxE = positions(x_BxLxE)
      if with_cls:
        cls_1x1xE = self.param("cls", nn.initializers.zeros, (1, 1, c.emb_dim))
        cls_Bx1xE = jnp.broadcast_to(cls_1x1xE, (x_BxLxE.shape[0], 1, c.emb_dim))
        x_BxLxE = jnp.concatenate([cls_Bx1xE, x_BxLxE], axis=1)
        cls_mask_Bx1 = (mask_BxL[:, :1] if c.lra_cls_mask
                        else jnp.ones_like(mask_BxL[:, :1]))
        mask_BxL = jnp.concatenate([cls_mask_Bx1, mask_BxL], axis=1)
        if c.cls_position:   # LRA's order: CLS at position 0
          x_BxLxE = positions(x_BxLxE)
      if c.embedding_dropout:
        x_BxLxE = nn.Dropout(c.dropout_rate)(
            x_BxLxE, deterministic=deterministic)
    x_BxLxE = x_BxLxE.astype(c.compute_dtype)
    pad = -x_BxLxE.shape[1] % c.length_multiple
    if pad:   # masked positions at the end, which every allowed attention ignores
      x_BxLxE = jnp.pad(x_BxLxE, ((0, 0), (0, pad), (0, 0)))
      mask_BxL = jnp.pad(mask_BxL, ((0, 0), (0, pad)))
    for i in range(c.num_layers):
      x_BxLxE = layers.EncoderBlock(c, i, name=f"encoderblock_{i}")(
          x_BxLxE, mask_BxL, deterministic=deterministic)
    if c.final_layer_norm:
      x_BxLxE = nn.LayerNorm(epsilon=c.layer_norm_epsilon, dtype=c.compute_dtype,
                             name="encoder_norm")(x_BxLxE)
    x_BxLxE = x_BxLxE.astype(jnp.float32)
    if self.return_states:   # one state per input token: no CLS, no length padding
      start = int(c.embedding_type != "bert" and c.classifier_pool == "CLS"
                  and self.prepend_cls)
      return x_BxLxE[:, start:start + tokens_BxL.shape[1]]
    if c.classifier_pool == "CLS":
      pooled_BxE = x_BxLxE[:, 0]
    elif c.lra_mean_over_pads:   # LRA's bug, an option: the input's pads count
      pooled_BxE = x_BxLxE[:, :x_BxLxE.shape[1] - pad].mean(1)
    else:
      m_BxLx1 = mask_BxL[..., None].astype(jnp.float32)
      pooled_BxE = (x_BxLxE * m_BxLx1).sum(1) / jnp.maximum(m_BxLx1.sum(1), 1.0)
    if c.pooler:   # BERT's BertPooler: tanh(Dense(E)) of the pooled state
      kernel_init, bias_init = base.initializers(c.emb_dim, c.dense_init)
      pooled_BxE = jnp.tanh(nn.Dense(c.emb_dim, kernel_init=kernel_init,
                                     bias_init=bias_init, name="pooler")(pooled_BxE))
    return pooled_BxE

  def _bert_embeddings(self, tokens_BxL, deterministic: bool):
    """BERT's embeddings (``embedding_type="bert"``, Hugging Face ``BertEmbeddings`` with
    token type 0): ``Dropout(LN(embed[t] + pos[0..L-1] + token_type[0]))`` -> ``[B, L, E]``
    float32. Called from the compact ``__call__``, so its parameters are the encoder's
    (``embed``, ``posembed``, ``token_type_embedding``, ``embed_norm``)."""
    c, init = self.config, nn.initializers.normal(stddev=BERT_INIT_STDDEV)
    x_BxLxE = nn.Embed(self.vocab_size, c.emb_dim, embedding_init=init,
                       name="embed")(tokens_BxL.astype(jnp.int32))
    if c.zero_pad_embedding:
      x_BxLxE = x_BxLxE * (tokens_BxL != 0)[..., None].astype(x_BxLxE.dtype)
    x_BxLxE = layers.AddPositionEmbs(c.max_positions or c.max_length,
                                     learned=c.learn_pos_emb, init=c.pos_emb_init,
                                     name="posembed")(x_BxLxE)
    if c.type_vocab_size:
      types_TxE = self.param("token_type_embedding", init,
                             (c.type_vocab_size, c.emb_dim))
      x_BxLxE = x_BxLxE + types_TxE[0]
    x_BxLxE = nn.LayerNorm(epsilon=c.layer_norm_epsilon, name="embed_norm")(x_BxLxE)
    if c.embedding_dropout:
      x_BxLxE = nn.Dropout(c.dropout_rate)(
          x_BxLxE, deterministic=deterministic)
    return x_BxLxE


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
  ``dense_init="torch"`` (the SimpleTRON authors' ``TClassifier``). The head's options are
  the encoder's :class:`ModelConfig` fields ``head`` (``"mlp"``: the layers above;
  ``"dense"``: one Dense(num_classes), LRA's ``SinkhornTransformerEncoder``),
  ``head_activation`` and ``dense_init``.

  Attributes:
    encoder: the :class:`Encoder`.
    num_classes: number of labels.

  Call: ``(tokens_BxL, mask_BxL | None, deterministic) -> logits_BxC`` float32.
  """

  encoder: Encoder
  num_classes: int

  @nn.compact
  def __call__(self, tokens_BxL, mask_BxL=None, *, deterministic: bool = True):
    h_BxF = self.encoder(tokens_BxL, mask_BxL, deterministic=deterministic)
    c = self.encoder.config
    if c.head == "mlp":
      h_BxF = HEAD_ACTIVATIONS[c.head_activation](
          _head_dense(c.mlp_dim, "head_hidden", c.dense_init, h_BxF))
    return _head_dense(self.num_classes, "head_logits", c.dense_init, h_BxF)


class DualEncoderClassifier(nn.Module):
  """LRA's matching model: one shared encoder for both documents and a two-layer head.

  Follows LRA ``models/transformer/transformer.py`` (``TransformerDualEncoder``) with
  ``models/layers/common_layers.py`` ``classifier_head_dual``: the pooled encodings ``u``,
  ``v`` of the two documents are combined by the encoder config's ``interaction`` and fed
  to Dense(mlp_dim) -> act -> Dense(mlp_dim // 2) -> act -> Dense(num_classes), with act
  its ``head_activation`` (ReLU in LRA and the authors) and flax's default init (as LRA's;
  torch's under ``dense_init="torch"``, the SimpleTRON authors' ``DualClassifier`` in
  ``lra/notebooks/bpe_matching_setup_simple_2.ipynb``). ``interaction="concat"``
  (default): ``[u, v]`` (``[B, 2E]``), what LRA's code ran (``interaction=None``) and the
  SimpleTRON authors' ``DualClassifier``; ``"nli"``: ``[u, v, u * v, u - v]``
  (``[B, 4E]``), the LRA paper's text. LRA's encoders here have no CLS token: see
  :attr:`Encoder.prepend_cls`.

  Attributes:
    encoder: the :class:`Encoder`, shared by both documents.
    num_classes: number of labels.

  Call: ``(tokens1_BxL, mask1_BxL | None, tokens2_BxL2, mask2_BxL2 | None,
  deterministic) -> logits_BxC`` float32. ``L`` and ``L2`` may differ.

  Raises:
    ValueError: if ``tokens2_BxL2`` is missing.
  """

  encoder: Encoder
  num_classes: int

  @nn.compact
  def __call__(self, tokens1_BxL, mask1_BxL=None, tokens2_BxL=None, mask2_BxL=None, *,
               deterministic: bool = True):
    if tokens2_BxL is None:
      raise ValueError("the dual encoder needs two documents (batch keys inputs and inputs2)")
    u_BxE = self.encoder(tokens1_BxL, mask1_BxL, deterministic=deterministic)
    v_BxE = self.encoder(tokens2_BxL, mask2_BxL, deterministic=deterministic)
    parts = [u_BxE, v_BxE]
    c = self.encoder.config
    if c.interaction == "nli":
      parts += [u_BxE * v_BxE, u_BxE - v_BxE]
    h_BxF = jnp.concatenate(parts, axis=-1)
    for name, width in (("head_hidden", c.mlp_dim), ("head_hidden2", c.mlp_dim // 2)):
      h_BxF = HEAD_ACTIVATIONS[c.head_activation](_head_dense(width, name, c.dense_init, h_BxF))
    return _head_dense(self.num_classes, "head_logits", c.dense_init, h_BxF)


def _as_model_config(model: ModelConfig | ml_collections.ConfigDict) -> ModelConfig:
  """``model`` itself, or the :class:`ModelConfig` of a ``config.model`` ConfigDict
  (:meth:`ModelConfig.from_config_dict`, which raises ValueError naming ``model.<field>``)."""
  return model if isinstance(model, ModelConfig) else ModelConfig.from_config_dict(model)


def build_classifier(model: ModelConfig | ml_collections.ConfigDict, *, vocab_size: int,
                     num_classes: int, dual: bool = False) -> nn.Module:
  """Builds the classifier of a model config.

  Args:
    model: the :class:`ModelConfig`, or ``config.model`` (converted once by
      :meth:`ModelConfig.from_config_dict`).
    vocab_size: token ids in ``[0, vocab_size)``.
    num_classes: number of labels.
    dual: build LRA's two-document :class:`DualEncoderClassifier` (retrieval).

  Returns:
    An unbound :class:`ClassificationEncoder`, or :class:`DualEncoderClassifier` when
    ``dual``.

  Raises:
    ValueError: naming ``model.<field>``, see :meth:`ModelConfig.from_config_dict`.
  """
  encoder = build_encoder(model, vocab_size=vocab_size, dual=dual)
  if dual:
    return DualEncoderClassifier(encoder=encoder, num_classes=num_classes)
  return ClassificationEncoder(encoder=encoder, num_classes=num_classes)


def build_encoder(model: ModelConfig | ml_collections.ConfigDict, *, vocab_size: int,
                  dual: bool = False, return_states: bool = False) -> Encoder:
  """The unbound :class:`Encoder` of a model config: the encoder of
  :func:`build_classifier`, or with ``return_states`` the same encoder returning per-token
  states (``[B, L, E]``; self-pretraining's LM heads, :mod:`simpletron_jax.train.pretraining`).

  Args:
    model: the :class:`ModelConfig`, or ``config.model`` (converted once).
    vocab_size: token ids in ``[0, vocab_size)``.
    dual: the retrieval encoder (``model.lra_dual_no_cls`` applies).
    return_states: see :class:`Encoder`.

  Raises:
    ValueError: naming ``model.<field>``, see :meth:`ModelConfig.from_config_dict`.
  """
  model = _as_model_config(model)
  return Encoder(config=model, vocab_size=vocab_size,
                 prepend_cls=not (dual and model.lra_dual_no_cls), return_states=return_states)
