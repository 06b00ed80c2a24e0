"""Each attention's experiment facts: the LRA baseline it reproduces, with the options LRA's code
ran and the options under which it computes LRA's bugs; whether it is one of SimpleTRON's
paper variants; the options the configs tie to the pooling or the length; how
:mod:`simpletron_jax.tools.explain` reads its map. One :class:`AttentionRecipe` per attention,
keyed by its name in the attention registry (:mod:`simpletron_jax.model.attention`), beside
the task recipes (:mod:`simpletron_jax.experiments.recipes`).

``configs/lra.py`` reads them (LRA's settings from ``lra_benchmarks/*/configs/`` at commit
cd31e5c; SimpleTRON's appendix A); :func:`get` returns an attention's record (the empty
record for an attention without experiment facts), :func:`register` adds one, docs/configs.md
says when a new attention needs one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from simpletron_jax.model import attention

EXPLAIN_METHODS = ("softmax_weights", "implicit_exact", "value_jacobian")
"""How :mod:`simpletron_jax.tools.explain` gets a variant's map
(:attr:`AttentionRecipe.explain_method`): the weights the module sows, the exact implicit map
it sows, or the value Jacobian."""
LRA_MASKING_OFF = {"lra_masking": False}
"""The masking fix of LRA's linear, Performer and Linformer, in their ``lra_options`` so that
``--config.model.attention_kwargs.lra_masking=True`` switches LRA's missing mask on."""
LRA_BUGS_OFF = {"lra_bugs": False}
"""In ``lra_options`` so that ``--config.model.attention_kwargs.lra_bugs=True`` switches LRA's
bugs on."""


@dataclasses.dataclass(frozen=True)
class AttentionRecipe:
  """One attention's experiment facts; the defaults are those of an attention that is no LRA
  baseline and no SimpleTRON variant.

  Attributes:
    lra_model_type: LRA's ``config.model_type`` of the baseline this attention reproduces
      (``lra_benchmarks/*/configs/``); None: not an LRA baseline.
    lra_options: the ``attention_kwargs`` LRA's code ran for the baseline on every task (a
      task's own, ``TaskRecipe.lra_baselines``, win); see ``configs/lra.py``.
    lra_bug_options: the ``attention_kwargs`` under which the module computes what LRA's
      module computed, bugs included (docs/lra_parity.md; the ``:lra_code`` variant,
      checked against LRA's logits by tests/test_lra_golden.py).
    lra_encoder: ``config.model`` fields of LRA's encoder for this baseline on the one-input
      tasks (LRA's dual encoder uses the common one): Sinkhorn's
      ``SinkhornTransformerEncoder``, MEAN pooling and one Dense head.
    simpletron: one of SimpleTRON's paper variants (Yorsh et al., Table 1): its configs take
      the paper's appendix A settings, keep its ``max_length`` and have the ``:authors``
      variants.
    follows_max_length: its option ``max_length`` sizes a weight or lays out its pattern on
      the padded length; ``configs/lra.py`` sets it to ``model.max_length`` plus 1 with a
      prepended CLS token.
    cls_option: an option the configs set to whether the pooling is CLS
      (``model.classifier_pool == "CLS"``): Sparse's ``global_first``, LRA's
      ``use_cls_token``.
    explain_method: how :mod:`simpletron_jax.tools.explain` reads its map, one of
      :data:`EXPLAIN_METHODS`.
  """

  lra_model_type: str | None = None
  lra_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  lra_bug_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  lra_encoder: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  simpletron: bool = False
  follows_max_length: bool = False
  cls_option: str | None = None
  explain_method: str = "value_jacobian"


REGISTRY: dict[str, AttentionRecipe] = {}


def register(name: str, recipe: AttentionRecipe) -> AttentionRecipe:
  """Adds ``recipe`` as the experiment facts of the registered attention ``name``.

  Raises:
    ValueError: for an unknown attention (naming ``model.attention``), one that has a record
      already, an ``explain_method`` not in :data:`EXPLAIN_METHODS`, or a ``cls_option``
      that is not an option of the attention.
  """
  spec = attention.get(name)
  if name in REGISTRY:
    raise ValueError(f"attention {name!r} already has an experiments record")
  if recipe.explain_method not in EXPLAIN_METHODS:
    raise ValueError(f"attention {name!r}: explain_method={recipe.explain_method!r}; "
                     f"expected one of {list(EXPLAIN_METHODS)}")
  if recipe.cls_option is not None and recipe.cls_option not in spec.options():
    raise ValueError(f"attention {name!r}: cls_option={recipe.cls_option!r} is not one of its "
                     f"options {sorted(spec.options())}")
  REGISTRY[name] = recipe
  return recipe


def get(name: str) -> AttentionRecipe:
  """The experiment facts of attention ``name``; the empty :class:`AttentionRecipe` for a
  registered attention without a record.

  Raises:
    ValueError: for an unknown attention (naming the config field ``model.attention``).
  """
  attention.get(name)
  return REGISTRY.get(name, AttentionRecipe())


def lra_baselines() -> tuple[str, ...]:
  """The registered attentions that reproduce an LRA baseline (an
  :attr:`AttentionRecipe.lra_model_type`), sorted."""
  return tuple(name for name in attention.names() if get(name).lra_model_type is not None)


def simpletron_names() -> tuple[str, ...]:
  """SimpleTRON's paper variants (:attr:`AttentionRecipe.simpletron`), sorted."""
  return tuple(name for name in attention.names() if get(name).simpletron)


# SimpleTRON's variants (paper Table 1): the authors' implicit map is exact.
for _name in ("simple", "simple_res", "simple_resl"):
  register(_name, AttentionRecipe(simpletron=True, explain_method="implicit_exact"))
register("softmax", AttentionRecipe(
    lra_model_type="transformer",
    lra_bug_options={"lra_masking": True},   # query AND key mask: pad rows uniform
    explain_method="softmax_weights"))
register("linear", AttentionRecipe(
    lra_model_type="linear_transformer", lra_options=LRA_MASKING_OFF,
    lra_bug_options={"lra_masking": True},   # no padding mask at all
    explain_method="implicit_exact"))
# LRA's Performer: ``models/performer/performer.py``'s default
# ``make_fast_generalized_attention``, deterministic ``relu(x) + 0.001`` (ListOps's recipe
# has ``listops/configs/performer_base.py``'s FAVOR+ softmax).
register("performer", AttentionRecipe(
    lra_model_type="performer",
    lra_options={"kernel": "relu_deterministic", **LRA_MASKING_OFF},
    lra_bug_options={"lra_masking": True, "lra_bugs": True},   # + features seeded from sum(q)
    explain_method="implicit_exact"))
# LRA's Linformer: ``low_rank_features=16`` (``models/linformer/linformer_attention.py``
# default; the text config's 32 is a top-level field its train.py never passes).
register("linformer", AttentionRecipe(
    lra_model_type="linformer", lra_options={"k": 16, **LRA_MASKING_OFF},
    lra_bug_options={"lra_masking": True}, follows_max_length=True))
register("local", AttentionRecipe(
    lra_model_type="local", lra_options=LRA_BUGS_OFF, lra_bug_options={"lra_bugs": True}))
# LRA's ``use_cls_token``: position 0 is global exactly when the pooling is CLS.
register("sparse", AttentionRecipe(
    lra_model_type="sparse_transformer", lra_options=LRA_BUGS_OFF,
    lra_bug_options={"lra_bugs": True}, cls_option="global_first"))
register("longformer", AttentionRecipe(
    lra_model_type="longformer",
    lra_bug_options={"lra_bugs": True}))   # pad query rows uniform over every position
# BigBird lays its pattern (global last block, random blocks) out on LRA's padded length.
register("bigbird", AttentionRecipe(
    lra_model_type="bigbird", lra_options=LRA_BUGS_OFF,
    lra_bug_options={"lra_bugs": True},   # appended keys real, pad rows zero, no dropout
    follows_max_length=True))
# LRA's SinkhornTransformerEncoder: no CLS, MEAN pooling, one Dense head on emb_dim. For CLS
# it raises "Pooling method not supported yet", so LRA's text and image configs never ran;
# its dual encoder (retrieval) pools CLS through classifier_head_dual like the others.
register("sinkhorn", AttentionRecipe(
    lra_model_type="sinkhorn", lra_bug_options={"lra_bugs": True},
    lra_encoder={"classifier_pool": "MEAN", "head": "dense"}, follows_max_length=True))
# LRA's ``models/synthesizer/synthesizer.py`` defaults to random logits plus the dot product
# (``synthesizer_mode='random'``, ``ignore_dot_product=False``); the text config's factorized
# settings are top-level fields, never passed. The dense form LRA never ran.
register("synthesizer", AttentionRecipe(lra_model_type="synthesizer", follows_max_length=True))
register("synthesizer_random", AttentionRecipe(
    lra_model_type="synthesizer", lra_options={"dot_product": True},
    lra_bug_options={"lra_bugs": True}, follows_max_length=True))
register("reformer", AttentionRecipe(
    lra_model_type="reformer", lra_options=LRA_BUGS_OFF, lra_bug_options={"lra_bugs": True}))
for _name in ("aft_full", "aft_local"):   # position biases sized by the length
  register(_name, AttentionRecipe(follows_max_length=True))
