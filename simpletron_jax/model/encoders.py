"""The LRA encoder with a pluggable attention (LRA ``models/transformer/transformer.py``) and
its classifier heads (``models/layers/common_layers.py``). BERT's encoder is a configuration of
the same :class:`Encoder` (docs/bert.md). Differences from LRA: docs/lra_parity.md."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from simpletron_jax.model import layers
from simpletron_jax.model.attention import base
from simpletron_jax.model.model_config import HEAD_ACTIVATIONS, ModelConfig

# BERT's ``initializer_range``.
BERT_INIT_STDDEV = 0.02


class Encoder(nn.Module):
  """Embeddings, blocks, final LayerNorm and pooling: LRA's, or BERT's, as ``config`` says.

  Attributes:
    config: the :class:`ModelConfig`.
    vocab_size: number of token ids, 0 being padding.
    prepend_cls: with CLS pooling, prepend CLS; False pools position 0 (``lra_dual_no_cls``).
    return_states: return the per-token states ``x_BxLxE`` (no CLS, padding or pooling).

  Call: ``(tokens_BxL int, mask_BxL bool | None) -> x_BxE`` float32 (``x_BxLxE`` with
  ``return_states``), computed in ``config.dtype``. ``mask_BxL`` defaults to ``tokens_BxL > 0``
  (image tasks pass all-True: pixel value 0 is real).

  Raises:
    ValueError: naming ``model.max_length`` if the input is longer than the position table.
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
    if pad:
      x_BxLxE = jnp.pad(x_BxLxE, ((0, 0), (0, pad), (0, 0)))
      mask_BxL = jnp.pad(mask_BxL, ((0, 0), (0, pad)))
    for i in range(c.num_layers):
      x_BxLxE = layers.EncoderBlock(c, i, name=f"encoderblock_{i}")(
          x_BxLxE, mask_BxL, deterministic=deterministic)
    if c.final_layer_norm:
      x_BxLxE = nn.LayerNorm(epsilon=c.layer_norm_epsilon, dtype=c.compute_dtype,
                             name="encoder_norm")(x_BxLxE)
    x_BxLxE = x_BxLxE.astype(jnp.float32)
    if self.return_states:
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
    """BERT's embeddings (Hugging Face ``BertEmbeddings``, token type 0), ``x_BxLxE`` float32:
    ``Dropout(LN(embed[t] + pos[0..L-1] + token_type[0]))``."""
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
  """Dense(width) of ``x_BxF`` -> ``[B, width]``, with flax's default init (LRA's heads) or,
  ``init="torch"``, ``nn.Linear``'s (the SimpleTRON authors' ``TClassifier``)."""
  if init == "torch":
    kernel_init, bias_init = base.initializers(x_BxF.shape[-1], init)
    return nn.Dense(width, kernel_init=kernel_init, bias_init=bias_init, name=name)(x_BxF)
  return nn.Dense(width, name=name)(x_BxF)


class ClassificationEncoder(nn.Module):
  """Encoder plus LRA's ``common_layers.classifier_head`` (``config.head``):
  ``(tokens_BxL, mask_BxL | None) -> logits_BxC`` float32."""

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
  """LRA's matching model (``transformer.py`` ``TransformerDualEncoder``): one shared encoder
  for both documents, then ``common_layers.classifier_head_dual``, Dense(mlp_dim) -> act ->
  Dense(mlp_dim // 2) -> act -> Dense(num_classes), on the ``config.interaction`` of u, v.

  Call: ``(tokens1_BxL, mask1_BxL | None, tokens2_BxL2, mask2_BxL2 | None) -> logits_BxC``
  float32; ``L`` and ``L2`` may differ.

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
  """``model``, converted by :meth:`ModelConfig.from_config_dict` if a ConfigDict."""
  return model if isinstance(model, ModelConfig) else ModelConfig.from_config_dict(model)


def build_classifier(model: ModelConfig | ml_collections.ConfigDict, *, vocab_size: int,
                     num_classes: int, dual: bool = False) -> nn.Module:
  """The unbound :class:`ClassificationEncoder`, or :class:`DualEncoderClassifier` if ``dual``.

  Args:
    model: the :class:`ModelConfig`, or ``config.model``.
    vocab_size: token ids in ``[0, vocab_size)``.
    num_classes: number of labels.
    dual: LRA's two-document model (retrieval).

  Raises:
    ValueError: naming ``model.<field>`` (:meth:`ModelConfig.from_config_dict`).
  """
  encoder = build_encoder(model, vocab_size=vocab_size, dual=dual)
  if dual:
    return DualEncoderClassifier(encoder=encoder, num_classes=num_classes)
  return ClassificationEncoder(encoder=encoder, num_classes=num_classes)


def build_encoder(model: ModelConfig | ml_collections.ConfigDict, *, vocab_size: int,
                  dual: bool = False, return_states: bool = False) -> Encoder:
  """The unbound :class:`Encoder` of :func:`build_classifier` (same arguments); with
  ``return_states``, per-token states (:mod:`simpletron_jax.train.pretraining`).

  Raises:
    ValueError: naming ``model.<field>`` (:meth:`ModelConfig.from_config_dict`).
  """
  model = _as_model_config(model)
  return Encoder(config=model, vocab_size=vocab_size,
                 prepend_cls=not (dual and model.lra_dual_no_cls), return_states=return_states)
