"""Self-pretraining (SPT): a denoising objective on the task's own training split, then
fine-tuning, for every attention (docs/experiments.md).

From Amos, Berant & Gupta, "Never Train from Scratch" (ICLR 2024, arXiv 2310.02980), and
their code (github.com/IdoAmos/not-from-scratch, commit f919137): masked-token denoising
(``dataset.mlm_prob``, 0.5 in the README) or next-token prediction (``dataset.causal_lm``);
the loss on masked positions only (``ignore_val``, ``configs/dataset/listops-lm.yaml``); a
Bernoulli draw per real token, replaced by a [MASK] id (``MaskedSequenceDatasetWrapper.mask``,
no 80/10/10); the linear LM head (``SequenceDecoder``); each stage's optimisation. The
encoders, data and image targets (256 pixel-value tokens, not their L1) stay LRA's.

[MASK] is the new id ``vocab_size``; the fine-tuning model reserves its row so ``init_from``
copies the embedding. The mask comes from the step's dropout key in training and from a hash
of each row in evaluation, so a resumed run and every evaluation draw the same masks.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from simpletron_jax.experiments import recipes
from simpletron_jax.model import encoders

# ``pretrain.objective``: "none" (classifier, fine-tuning), "mlm" or "causal" (next token).
OBJECTIVES = ("none", "mlm", "causal")
# Amos et al.'s masking ratio for LRA (their README: ``dataset.mlm_prob=0.5``).
PAPER_MASK_RATE = 0.5
# ``pretrain.lm_head``: "linear" (Amos et al.'s) or "mlp" (BERT's Dense -> GELU -> LayerNorm).
LM_HEADS = ("linear", "mlp")


def apply_paper_recipe(config: ml_collections.ConfigDict, stage: str) -> None:
  """Sets in ``config`` the optimisation of Amos et al.'s code for ``config.task`` and
  ``stage`` (``"spt"`` or ``"ft"``): the record's ``pretraining[stage]`` (``SptRecipe``, from
  ``configs/experiment/lra/transformer-lra-<task>[-mlm].yaml``; Path-X: ``-small.yaml``),
  epochs counted in ``train_examples``; AdamW (0.9, 0.999), warmup then constant, dropout 0.

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


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
  """The ``config.pretrain`` section (the ``:spt`` / ``:spt_ft`` configs), checked by
  :meth:`validate`.

  Attributes:
    objective: one of :data:`OBJECTIVES`; "none": the classifier (fine-tuning).
    mask_rate: probability a real token is masked ("mlm"), in ``(0, 1]``.
    mask_token: reserve the [MASK] row (needed for "mlm" and for fine-tuning).
    tie_head: LM output weights = input embedding, transposed.
    lm_head: one of :data:`LM_HEADS`.
  """
  objective: str = "none"
  mask_rate: float = PAPER_MASK_RATE
  mask_token: bool = True
  tie_head: bool = False
  lm_head: str = "linear"

  def validate(self) -> None:
    """Raises ValueError naming ``pretrain.objective`` (unknown), ``pretrain.lm_head``,
    ``pretrain.mask_rate`` (not in ``(0, 1]``) or ``pretrain.mask_token`` ("mlm" without the
    row); with objective "none" only the objective is checked."""
    if self.objective not in OBJECTIVES:
      raise ValueError(f"pretrain.objective={self.objective!r}; expected one of "
                       f"{list(OBJECTIVES)}")
    if self.objective == "none":
      return
    if self.lm_head not in LM_HEADS:
      raise ValueError(f"pretrain.lm_head={self.lm_head!r}; expected one of {list(LM_HEADS)}")
    if self.objective == "mlm":
      rate = self.mask_rate
      if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1:
        raise ValueError(f"pretrain.mask_rate={rate!r} must be a number in (0, 1]")
      if not self.mask_token:
        raise ValueError("pretrain.objective='mlm' needs the [MASK] id: set "
                         "pretrain.mask_token=True")


def default_config(objective: str = "mlm") -> ml_collections.ConfigDict:
  """The ``config.pretrain`` section of ``objective``, the rest at :class:`PretrainConfig`'s
  defaults."""
  return ml_collections.ConfigDict(dataclasses.asdict(PretrainConfig(objective=objective)))


def check_model(pretrain: PretrainConfig, model: encoders.ModelConfig, dual: bool = False
                ) -> None:
  """Checks a validated ``pretrain`` against ``model``.

  Raises:
    ValueError: naming ``pretrain.objective``: an LM objective with ``dual`` or
      ``model.last_block_cls_only``; "causal" on a non-causal attention.
  """
  objective = pretrain.objective
  if objective == "none":
    return
  if dual:
    raise ValueError(f"pretrain.objective={objective!r} is not supported on the two-document "
                     "retrieval task yet; use 'none'")
  if model.last_block_cls_only:
    raise ValueError(f"pretrain.objective={objective!r} needs every token's state, but "
                     "model.last_block_cls_only=True updates only CLS in the last block")
  if objective == "causal":
    names = model.layer_attentions()
    kwargs = dict(model.attention_kwargs)
    if any(n != model.attention for n in names) or not kwargs.get("causal", False):
      raise ValueError(f"pretrain.objective='causal' (next-token prediction) needs a causal "
                       f"attention in every block, but model.attention={model.attention!r} "
                       f"with attention_kwargs.causal={kwargs.get('causal')!r} sees the "
                       "future; use an attention with causal=True (aft_*) or objective='mlm'")


def mask_tokens(keys_B, tokens_BxL, mask_BxL, rate: float, mask_id: int):
  """Selects each real token (``mask_BxL`` bool) of int ``tokens_BxL`` with probability
  ``rate`` under its row's key (``keys_B`` ``[B, 2]`` uint32).

  Returns:
    ``(inputs_BxL int32, selected_BxL bool)``: the selected tokens set to ``mask_id``.
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
  """``(targets_BxL int32, weights_BxL float32)`` of next-token prediction: the tokens shifted
  left by one (last target 0), and 1 where both ``t`` and ``t + 1`` are real."""
  mask_BxL = mask_BxL.astype(bool)
  targets_BxL = jnp.pad(tokens_BxL[:, 1:], ((0, 0), (0, 1))).astype(jnp.int32)
  next_real_BxL = jnp.pad(mask_BxL[:, 1:], ((0, 0), (0, 1)))
  return targets_BxL, (mask_BxL & next_real_BxL).astype(jnp.float32)


class MaskedLMEncoder(nn.Module):
  """An :class:`encoders.Encoder` (``return_states``) under a language-model head.

  ``encoder`` keeps ``ClassificationEncoder``'s parameter paths, so ``init_from`` copies it;
  ``vocab_size`` counts the [MASK] row, ``mask_id``; ``tie_head``: logits from the transposed
  input embedding plus a bias; ``num_classes``: the task's labels (the evaluation's majority
  rate counts them).

  Call: ``(tokens_BxL int, mask_BxL bool | None = tokens_BxL > 0, deterministic) ->
  {"logits": [B, L, V] float32, "targets": [B, L] int32, "weights": [B, L] float32,
  "num_classes": int}``; training draws the mask from the ``dropout`` rng.
  """

  encoder: encoders.Encoder
  vocab_size: int
  num_classes: int
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
            "weights": weights_BxL, "num_classes": self.num_classes}


def build_model(model: encoders.ModelConfig, pretrain: PretrainConfig, *, vocab_size: int,
                num_classes: int, dual: bool = False) -> nn.Module:
  """:class:`MaskedLMEncoder` for a "mlm" or "causal" ``pretrain`` (validated), else
  :func:`encoders.build_classifier`'s model; with ``pretrain.mask_token`` either has the
  [MASK] id ``vocab_size`` too.

  Raises:
    ValueError: see :func:`check_model`.
  """
  check_model(pretrain, model, dual)
  rows = vocab_size + int(bool(pretrain.mask_token))
  if pretrain.objective == "none":
    return encoders.build_classifier(model, vocab_size=rows, num_classes=num_classes,
                                     dual=dual)
  encoder = encoders.build_encoder(model, vocab_size=rows, return_states=True)
  return MaskedLMEncoder(encoder=encoder, vocab_size=rows, num_classes=num_classes,
                         objective=pretrain.objective, mask_rate=float(pretrain.mask_rate),
                         mask_id=vocab_size, tie_head=bool(pretrain.tie_head),
                         lm_head=pretrain.lm_head)
