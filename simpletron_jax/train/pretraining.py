"""Self-pretraining (SPT): a denoising objective on the task's own training split, then
fine-tuning, for every attention.

Amos, Berant & Gupta, "Never Train from Scratch: Fair Comparison of Long-Sequence Models
Requires Data-Driven Priors" (ICLR 2024, arXiv 2310.02980) pretrain each model on the
downstream task's own inputs (labels unused) and then fine-tune it, which closes most of
LRA's gaps between architectures. What is taken from them, and from their code
(github.com/IdoAmos/not-from-scratch, read at commit f919137):

* the objectives: masked-token denoising for bidirectional encoders, next-token prediction
  for causal ones (their ``dataset.mlm_prob`` and ``dataset.causal_lm``; ``causal_lm``
  requires ``mlm_prob = 0`` there, and here the two are one choice, ``objective``);
* the masking rate 0.5 (:data:`PAPER_MASK_RATE`): their README's LRA command pretrains with
  ``dataset.mlm_prob=0.5``;
* the loss on masked positions only (their ``ignore_val: True``, "ignore the loss at
  masked pixels", ``configs/dataset/listops-lm.yaml``), cross-entropy over token ids
  (``lm_loss: ce``); for images and Pathfinder the targets are the 256 pixel values;
* each real token selected independently with probability ``mask_rate`` (a Bernoulli draw,
  so the count per sequence varies) and replaced by a dedicated [MASK] id, never by a random
  token (their ``MaskedSequenceDatasetWrapper.mask``: no BERT 80/10/10, no spans in any
  Transformer LRA config);
* the LM head: one Dense from each position's final state to the vocabulary, untied
  (``pretrain.lm_head = "linear"``, the default; their ``SequenceDecoder`` with
  ``l_output=None``). ``"mlp"`` is BERT's Dense(E) -> GELU -> LayerNorm before it, the head
  of the committed ``:tiny`` grid (docs/experiments.md); ``tie_head`` ties the output
  weights to the input embedding (not theirs);
* the optimisation of each stage, per task (each task record's ``pretraining``,
  :class:`simpletron_jax.train.recipes.SptRecipe`, applied by the paper-size ``:spt`` / ``:spt_ft``
  configs): AdamW (0.9, 0.999), linear warmup then a constant rate,
  no dropout, their learning rate, weight decay, batch and epochs.

What stays LRA's, not theirs: the encoder of each task (their Transformer is 6 x 512 on
ListOps and text, LRA's text model 4 x 256; they use fixed sinusoidal positions and mean
pooling), the task data (their Pathfinder is the contour-length-14 set, as LRA's hard
level), and for images the targets: they regress the normalised pixel with an L1 loss on
CIFAR and feed a second "masked" channel, here every pixel is a token, so the [MASK] id and
a cross-entropy over the 256 values serve both image tasks (theirs on Pathfinder and Path-X).
Their masking rate is given only for CIFAR (the README's ``dataset.mlm_prob=0.5``; the
other tasks' experiment files leave it to the command line), so 0.5 is used for every task.

**The [MASK] id.** Token 0 is padding, and in the image and Pathfinder tasks every id in
``[0, 256)`` is a real pixel value, so no existing id is free. [MASK] is a new id,
``vocab_size`` (one extra embedding row). So that ``init_from`` copies the embedding
(:mod:`simpletron_jax.model.transfer` copies by path *and* shape), the fine-tuning model reserves
the same row (``config.pretrain.mask_token = True`` with ``objective = "none"``, the
``:spt_ft`` configs); it never sees the id. A scratch baseline built without the row differs
only in that its embedding table has one row fewer (so its random init differs).

**Determinism.** The mask is a pure function of the step's dropout key and the row: in
training, :class:`MaskedLMEncoder` draws it from ``make_rng("dropout")`` (the loop's key
for the step, folded with the device index), so a resumed run draws the same masks as an
uninterrupted one; in evaluation (``deterministic=True``) from a key hashed from each row's
tokens (:func:`eval_row_keys`), so every evaluation masks an example the same way whatever
batch it is in.

**Metrics.** The model returns ``{"logits", "targets", "weights"}`` and
``steps.loss_fn`` computes the usual sums with ``count`` = the number of target positions
(masked tokens, or next tokens), so the loop's ``accuracy`` is masked-token accuracy and its
``loss`` the mean cross-entropy per target token.
"""

from __future__ import annotations

from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from simpletron_jax.model import encoders
from simpletron_jax.train import recipes

# Objectives (config field ``pretrain.objective``): "none" (classification; the fine-tuning
# stage), "mlm" (masked-token denoising) or "causal" (next-token prediction).
OBJECTIVES = ("none", "mlm", "causal")
# Amos et al.'s masking ratio for LRA (their README: ``dataset.mlm_prob=0.5``).
PAPER_MASK_RATE = 0.5
# LM heads (config field ``pretrain.lm_head``): "linear" (Amos et al.'s code: one Dense to
# the vocabulary) or "mlp" (BERT's Dense -> GELU -> LayerNorm first).
LM_HEADS = ("linear", "mlp")


def apply_paper_recipe(config: ml_collections.ConfigDict, stage: str) -> None:
  """Sets the optimisation of Amos et al.'s code for ``config.task``: its record's
  ``pretraining[stage]`` (:class:`simpletron_jax.train.recipes.SptRecipe`: the SPT code's
  ``configs/experiment/lra/transformer-lra-<task>[-mlm].yaml`` at commit f919137; Path-X:
  ``transformer-lra-pathx[-mlm]-small.yaml``), its epochs counted in the record's
  ``train_examples``. Every stage: AdamW (0.9, 0.999), warmup then constant, dropout 0.

  Args:
    config: a run config (its ``task``); changed in place: ``learning_rate``,
      ``weight_decay``, ``warmup`` and ``num_train_steps`` (steps), ``batch_size``,
      ``factors`` (warmup then constant), ``adam_b2``/``adam_eps`` (PyTorch's AdamW
      defaults), no gradient clipping, dropout 0, and validation and checkpoints once an epoch.
    stage: ``"spt"`` (pretraining) or ``"ft"`` (fine-tuning).

  Raises:
    ValueError: naming ``config.task`` when the code has no recipe for it, or ``stage``.
  """
  spec = recipes.get(config.task)
  if not spec.pretraining:
    known = [t for t, recipe in recipes.REGISTRY.items() if recipe.pretraining]
    raise ValueError(f"config.task={config.task!r}: no self-pretraining recipe; known: "
                     f"{known}")
  if stage not in ("spt", "ft"):
    raise ValueError(f"stage={stage!r}; expected 'spt' or 'ft'")
  recipe = spec.pretraining[stage]
  steps_per_epoch = spec.train_examples // recipe.batch_size
  config.learning_rate = recipe.learning_rate
  config.weight_decay = recipe.weight_decay
  config.warmup = recipe.warmup
  config.batch_size = recipe.batch_size
  config.num_train_steps = steps_per_epoch * recipe.epochs
  config.factors = "constant * linear_warmup"
  config.adam_b1, config.adam_b2, config.adam_eps = 0.9, 0.999, 1e-8
  config.grad_clip_norm = 0.0       # theirs clips no gradient (LRA's Path-X clips at 1.0)
  config.model.dropout_rate = 0.0
  config.model.attention_dropout_rate = 0.0
  config.eval_frequency = steps_per_epoch
  config.checkpoint_every = steps_per_epoch


def default_config(objective: str = "mlm") -> ml_collections.ConfigDict:
  """The ``config.pretrain`` section: ``objective`` (:data:`OBJECTIVES`), ``mask_rate``
  (the probability that a real token is masked, default :data:`PAPER_MASK_RATE`),
  ``lm_head`` (:data:`LM_HEADS`; default ``"linear"``, the SPT code's),
  ``mask_token`` (reserve the [MASK] row ``vocab_size``; needed for ``"mlm"``, and in the
  fine-tuning model so the embedding transfers) and ``tie_head`` (the LM head's output
  weights are the input embedding's, transposed)."""
  return ml_collections.ConfigDict({"objective": objective, "mask_rate": PAPER_MASK_RATE,
                                    "mask_token": True, "tie_head": False,
                                    "lm_head": "linear"})


def validate(pretrain: Mapping[str, Any],
             model: encoders.ModelConfig | ml_collections.ConfigDict, dual: bool = False) -> None:
  """Checks ``config.pretrain`` against the model config (a ``encoders.ModelConfig``, or
  ``config.model``, read through ``encoders.ModelConfig.from_config_dict``).

  Raises:
    ValueError: naming ``pretrain.lm_head`` (unknown), ``pretrain.objective`` (unknown; an
      LM objective on the two-document
      retrieval task, or with ``model.last_block_cls_only``, which leaves the token states
      stale; ``"causal"`` with an attention that is not causal), ``pretrain.mask_rate``
      (not in ``(0, 1]``) or ``pretrain.mask_token`` (``"mlm"`` without a [MASK] row);
      naming ``model.<field>`` for a bad model config.
  """
  objective = pretrain.get("objective", "none")
  if objective not in OBJECTIVES:
    raise ValueError(f"pretrain.objective={objective!r}; expected one of {list(OBJECTIVES)}")
  if objective == "none":
    return
  if dual:
    raise ValueError(f"pretrain.objective={objective!r} is not supported on the two-document "
                     "retrieval task yet; use 'none'")
  if not isinstance(model, encoders.ModelConfig):
    model = encoders.ModelConfig.from_config_dict(model)
  if model.last_block_cls_only:
    raise ValueError(f"pretrain.objective={objective!r} needs every token's state, but "
                     "model.last_block_cls_only=True updates only CLS in the last block")
  if pretrain.get("lm_head", "linear") not in LM_HEADS:
    raise ValueError(f"pretrain.lm_head={pretrain.get('lm_head')!r}; expected one of "
                     f"{list(LM_HEADS)}")
  if objective == "mlm":
    rate = pretrain.get("mask_rate", PAPER_MASK_RATE)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1:
      raise ValueError(f"pretrain.mask_rate={rate!r} must be a number in (0, 1]")
    if not pretrain.get("mask_token", True):
      raise ValueError("pretrain.objective='mlm' needs the [MASK] id: set "
                       "pretrain.mask_token=True")
  if objective == "causal":
    names = model.layer_attentions()
    kwargs = dict(model.attention_kwargs)
    if any(n != model.attention for n in names) or not kwargs.get("causal", False):
      raise ValueError(f"pretrain.objective='causal' (next-token prediction) needs a causal "
                       f"attention in every block, but model.attention={model.attention!r} "
                       f"with attention_kwargs.causal={kwargs.get('causal')!r} sees the "
                       "future; use an attention with causal=True (aft_*) or objective='mlm'")


def mask_tokens(keys_B, tokens_BxL, mask_BxL, rate: float, mask_id: int):
  """Selects and replaces the tokens to predict (masked-token denoising).

  Args:
    keys_B: ``[B, 2]`` uint32 PRNG keys, one per row (see the module docstring).
    tokens_BxL: int token ids.
    mask_BxL: bool, True at real positions; pads are never selected.
    rate: the probability that a real token is selected, in ``(0, 1]``.
    mask_id: the id that replaces every selected token.

  Returns:
    ``(inputs_BxL int32, selected_BxL bool)``: the tokens with the selected ones set to
    ``mask_id``, and the selection (the target positions).
  """
  uniform_BxL = jax.vmap(lambda k: jax.random.uniform(k, tokens_BxL.shape[1:]))(keys_B)
  selected_BxL = (uniform_BxL < rate) & mask_BxL.astype(bool)
  inputs_BxL = jnp.where(selected_BxL, mask_id, tokens_BxL).astype(jnp.int32)
  return inputs_BxL, selected_BxL


def eval_row_keys(tokens_BxL):
  """One PRNG key per row, hashed from the row's tokens (``[B, 2]`` uint32): evaluation
  masks each example the same way in every evaluation, whatever its batch."""
  positions_L = jnp.arange(1, tokens_BxL.shape[1] + 1, dtype=jnp.uint32)
  row_hash_B = jnp.sum(tokens_BxL.astype(jnp.uint32) * (positions_L * jnp.uint32(2654435761)),
                       axis=1, dtype=jnp.uint32)
  return jax.vmap(lambda h: jax.random.fold_in(jax.random.PRNGKey(0x5E1F), h))(row_hash_B)


def next_token_targets(tokens_BxL, mask_BxL):
  """Next-token prediction's targets: position ``t`` predicts token ``t + 1``.

  Returns:
    ``(targets_BxL int32, weights_BxL float32)``: the tokens shifted left by one (the last
    position's target is 0), and 1 where both ``t`` and ``t + 1`` are real tokens.
  """
  mask_BxL = mask_BxL.astype(bool)
  targets_BxL = jnp.pad(tokens_BxL[:, 1:], ((0, 0), (0, 1))).astype(jnp.int32)
  next_real_BxL = jnp.pad(mask_BxL[:, 1:], ((0, 0), (0, 1)))
  return targets_BxL, (mask_BxL & next_real_BxL).astype(jnp.float32)


class MaskedLMEncoder(nn.Module):
  """An :class:`encoders.Encoder` (with ``return_states``) under a language-model head.

  Attributes:
    encoder: the encoder; it is named ``encoder`` as in :class:`encoders.ClassificationEncoder`,
      so its parameters keep their paths (``encoder/...``) and ``init_from`` copies them.
    vocab_size: the logits' width: the task's ids plus the [MASK] row when reserved.
    objective: ``"mlm"`` or ``"causal"`` (:data:`OBJECTIVES`).
    mask_rate: see :func:`mask_tokens`.
    mask_id: the [MASK] id (the task's ``vocab_size``).
    tie_head: logits from the transposed input embedding (``encoder/embed/embedding``) plus
      a bias, instead of a Dense(vocab_size).
    lm_head: ``"linear"`` (the logits straight from each final state, as Amos et al.'s
      code) or ``"mlp"`` (Dense(E) -> GELU -> LayerNorm first, as BERT).

  Call: ``(tokens_BxL int, mask_BxL bool | None, deterministic) -> {"logits": [B, L, V]
  float32, "targets": [B, L] int32, "weights": [B, L] float32}``; ``mask_BxL`` defaults to
  ``tokens_BxL > 0``. Training (``deterministic=False``) draws the mask from the
  ``dropout`` rng stream.
  """

  encoder: encoders.Encoder
  vocab_size: int
  objective: str = "mlm"
  mask_rate: float = PAPER_MASK_RATE
  mask_id: int = 0
  tie_head: bool = False
  lm_head: str = "linear"

  @nn.compact
  def __call__(self, tokens_BxL, mask_BxL=None, *, deterministic: bool = True):
    if mask_BxL is None:
      mask_BxL = tokens_BxL > 0
    mask_BxL = mask_BxL.astype(bool)
    if self.objective == "mlm":
      if deterministic:
        keys_B = eval_row_keys(tokens_BxL)
      else:
        keys_B = jax.random.split(self.make_rng("dropout"), tokens_BxL.shape[0])
      inputs_BxL, selected_BxL = mask_tokens(keys_B, tokens_BxL, mask_BxL, self.mask_rate,
                                             self.mask_id)
      targets_BxL = tokens_BxL.astype(jnp.int32)
      weights_BxL = selected_BxL.astype(jnp.float32)
    elif self.objective == "causal":
      inputs_BxL = tokens_BxL
      targets_BxL, weights_BxL = next_token_targets(tokens_BxL, mask_BxL)
    else:
      raise ValueError(f"pretrain.objective={self.objective!r}; expected 'mlm' or 'causal'")
    h_BxLxE = self.encoder(inputs_BxL, mask_BxL, deterministic=deterministic)
    if self.lm_head == "mlp":
      h_BxLxE = nn.gelu(nn.Dense(h_BxLxE.shape[-1], name="lm_transform")(h_BxLxE))
      h_BxLxE = nn.LayerNorm(epsilon=self.encoder.config.layer_norm_epsilon,
                             name="lm_norm")(h_BxLxE)
    elif self.lm_head != "linear":
      raise ValueError(f"pretrain.lm_head={self.lm_head!r}; expected one of {list(LM_HEADS)}")
    if self.tie_head:
      table_VxE = self.encoder.variables["params"]["embed"]["embedding"]
      bias_V = self.param("lm_bias", nn.initializers.zeros, (self.vocab_size,))
      logits = h_BxLxE @ table_VxE.T.astype(h_BxLxE.dtype) + bias_V
    else:
      logits = nn.Dense(self.vocab_size, name="lm_logits")(h_BxLxE)
    return {"logits": logits.astype(jnp.float32), "targets": targets_BxL,
            "weights": weights_BxL}


def build_model(config: ml_collections.ConfigDict, *, vocab_size: int, num_classes: int,
                dual: bool = False) -> nn.Module:
  """The model of a run with a ``config.pretrain`` section (the ``:spt`` / ``:spt_ft``
  configs).

  Args:
    config: the run config (``config.model``, ``config.pretrain``).
    vocab_size: the task's ids ``[0, vocab_size)``; with ``pretrain.mask_token`` the model
      has one more, ``vocab_size`` itself, the [MASK] id.
    num_classes, dual: as :func:`encoders.build_classifier`.

  Returns:
    :class:`MaskedLMEncoder` for ``objective`` "mlm"/"causal", else the classifier of
    :func:`encoders.build_classifier` with the [MASK] row reserved (fine-tuning).

  Raises:
    ValueError: see :func:`validate` and :meth:`encoders.ModelConfig.from_config_dict`.
  """
  pretrain = config.pretrain
  validate(pretrain, config.model, dual)
  rows = vocab_size + int(bool(pretrain.get("mask_token", True)))
  objective = pretrain.get("objective", "none")
  if objective == "none":
    return encoders.build_classifier(config.model, vocab_size=rows, num_classes=num_classes,
                                     dual=dual)
  encoder = encoders.build_encoder(encoders.ModelConfig.from_config_dict(config.model),
                                   vocab_size=rows, return_states=True)
  return MaskedLMEncoder(encoder=encoder, vocab_size=rows, objective=objective,
                         mask_rate=float(pretrain.get("mask_rate", PAPER_MASK_RATE)),
                         mask_id=vocab_size, tie_head=bool(pretrain.get("tie_head", False)),
                         lm_head=pretrain.get("lm_head", "linear"))
