"""The attention registry: every variant by name, built with the call of its ``base`` module.

``get(name)`` returns an :class:`AttentionSpec`; ``spec.build(...)`` makes the
Flax module. A spec also tells the encoder block how to wire the variant
(SimpleTRON's double skip) and records its asymptotic cost, which the tests
use (a sub-quadratic variant must never build an ``L x L`` array), and holds the
variant's facts that others read: whether padding the length changes it
(``model.length_multiple``), its LRA settings (``configs/lra.py``) and how
:mod:`simpletron_jax.tools.explain` reads its map.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn

from simpletron_jax.model.attention.aft import AFTAttention
from simpletron_jax.model.attention.linear import LinearAttention
from simpletron_jax.model.attention.linformer import LinformerAttention
from simpletron_jax.model.attention.performer import PerformerAttention
from simpletron_jax.model.attention.simple import SimpleAttention
from simpletron_jax.model.attention.softmax import SoftmaxAttention


# Constructor arguments the encoder block passes to every variant (not config options).
ENCODER_ARGS = ("num_heads", "qkv_dim", "out_dim", "dropout_rate", "dtype", "num_queries",
                "use_bias", "dense_init")
# How :mod:`simpletron_jax.tools.explain` gets a variant's map (``AttentionSpec.explain_method``):
# the weights the module sows, the exact implicit map it sows, or the value Jacobian.
EXPLAIN_METHODS = ("softmax_weights", "implicit_exact", "value_jacobian")


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
  """How to build and wire one registered attention variant.

  Attributes:
    name: registry key, e.g. ``"simple_res"``.
    module: the Flax module class.
    fixed_kwargs: constructor arguments that define the variant.
    double_skip: if True the encoder block adds SimpleTRON's second skip,
      ``out = x1 + MLP(LN(x1)) + x0`` (Simple-Res, paper Table 1).
    quadratic: True when time or memory grows as L^2 (exempt from the
      no-``L x L`` test).
    paper: the source of the variant.
    length_padding_exact: True when its output at a real position is a masked sum over all
      keys, so masked positions appended after the last token change nothing
      (``model.length_multiple`` is allowed). False for variants with blocks, chunks,
      hashing or random blocks laid out over the length, or weights sized by it.
    padding_exact_options: options that must hold these values for
      ``length_padding_exact`` to hold (Simple's published ``normalizer="padded"`` and
      ``mask_pads=False`` let the pads in).
    follows_max_length: its option ``max_length`` sizes a weight or lays out its pattern
      on the padded length; ``configs/lra.py`` sets it to ``model.max_length`` plus 1 with
      a prepended CLS token.
    lra_model_type: LRA's ``config.model_type`` of the baseline this variant reproduces
      (``lra_benchmarks/*/configs/``, commit cd31e5c); None: not an LRA baseline.
    lra_options: the ``attention_kwargs`` LRA's code ran for the baseline on every task
      (a task record's own, ``TaskSpec.lra_baselines``, win); see ``configs/lra.py``.
    lra_bug_options: the ``attention_kwargs`` under which the module computes what LRA's
      module computed, bugs included (docs/lra_parity.md; ``configs/lra.py``'s
      ``:lra_code``, checked against LRA's logits by tests/test_lra_golden.py).
    explain_method: how :mod:`simpletron_jax.tools.explain` reads its map, one of
      :data:`EXPLAIN_METHODS`.
  """

  name: str
  module: type[nn.Module]
  fixed_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  double_skip: bool = False
  quadratic: bool = False
  paper: str = ""
  length_padding_exact: bool = False
  padding_exact_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  follows_max_length: bool = False
  lra_model_type: str | None = None
  lra_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  lra_bug_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  explain_method: str = "value_jacobian"

  def padding_inexact_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options in ``options`` (``model.attention_kwargs``; absent ones at the module's
    defaults) that differ from :attr:`padding_exact_options`, i.e. that make padding the
    length change the variant's output; empty when none do."""
    defaults = self.options()
    return {k: options.get(k, defaults.get(k)) for k, v in self.padding_exact_options.items()
            if options.get(k, defaults.get(k)) != v}

  def module_fields(self) -> set[str]:
    """The module's constructor fields (``parent`` and ``name`` excluded)."""
    return {f.name for f in dataclasses.fields(self.module)} - {"parent", "name"}

  def options(self) -> dict[str, Any]:
    """The variant's options with their module defaults, in field order: the fields a
    config may set in ``model.attention_kwargs`` (not those the encoder passes,
    :data:`ENCODER_ARGS`, nor ``fixed_kwargs``). ``configs/lra.make_config`` stores them so
    that ``--config.model.attention_kwargs.<option>=...`` overrides work."""
    skip = set(ENCODER_ARGS) | set(self.fixed_kwargs) | {"parent", "name"}
    return {f.name: f.default for f in dataclasses.fields(self.module)
            if f.name not in skip and f.default is not dataclasses.MISSING}

  def build(self, *, num_heads: int, qkv_dim: int, out_dim: int, dropout_rate: float,
            dtype, name: str | None = None, use_bias: bool = True, dense_init: str = "lra",
            **kwargs) -> nn.Module:
    """Instantiates the module.

    Args:
      num_heads, qkv_dim, out_dim, dropout_rate, dtype: the shared interface.
      use_bias: biases on the attention's projections (``model.attention_bias``).
      dense_init: their init, ``"lra"`` or ``"torch"`` (``model.dense_init``).
      name: Flax submodule name.
      **kwargs: variant options from ``config.model.attention_kwargs``; they
        may not override ``fixed_kwargs``.

    Returns:
      An unbound Flax module with call ``(x_BxLxE, mask_BxL, deterministic)``.

    Raises:
      ValueError: if ``kwargs`` tries to change a defining argument or names a
        field the module does not have. The options :func:`inherited_options` finds are
        dropped instead (the config checks warn about them).
    """
    clash = set(kwargs) & set(self.fixed_kwargs)
    if clash:
      raise ValueError(f"model.attention_kwargs may not set {sorted(clash)} for attention "
                       f"{self.name!r}; they define the variant")
    fields = {f.name for f in dataclasses.fields(self.module)}
    inherited = inherited_options(self.name, kwargs)
    kwargs = {k: v for k, v in kwargs.items() if k not in inherited}
    unknown = set(kwargs) - fields
    if unknown:
      raise ValueError(f"model.attention_kwargs has {sorted(unknown)}, unknown to attention "
                       f"{self.name!r}; its options are {sorted(fields - {'parent', 'name'})}")
    return self.module(num_heads=num_heads, qkv_dim=qkv_dim, out_dim=out_dim,
                       dropout_rate=dropout_rate, dtype=dtype, name=name, use_bias=use_bias,
                       dense_init=dense_init,
                       **self.fixed_kwargs, **kwargs)


REGISTRY: dict[str, AttentionSpec] = {}


def inherited_options(name: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
  """The entries of ``kwargs`` that attention ``name``'s module has no field for and another
  registered variant has as an option, with that very value as its default.

  A config file writes its attention's options, defaults included, into
  ``model.attention_kwargs`` so that each can be overridden; switched to another attention with
  ``--config.model.attention=NAME``, it still holds them. :meth:`AttentionSpec.build` drops
  these entries, and :func:`simpletron_jax.train.config_checks.validate_config` names them in a
  warning. An option that is not at another variant's default stays, and ``build`` refuses it.

  Args:
    name: a registered attention (``model.attention``).
    kwargs: ``model.attention_kwargs``.

  Returns:
    The dropped entries, ``{option: value}``; empty for a config made for ``name``.

  Raises:
    ValueError: for an unknown ``name`` (see :func:`get`).
  """
  own = {f.name for f in dataclasses.fields(get(name).module)}
  return {k: v for k, v in kwargs.items() if k not in own and any(
      k in spec.options() and spec.options()[k] == v and type(spec.options()[k]) is type(v)
      for spec in REGISTRY.values())}


def register(spec: AttentionSpec) -> AttentionSpec:
  """Adds ``spec`` under ``spec.name``.

  Raises:
    ValueError: if the name is taken, or ``spec.explain_method`` is not in
      :data:`EXPLAIN_METHODS`.
  """
  if spec.name in REGISTRY:
    raise ValueError(f"attention {spec.name!r} is already registered")
  if spec.explain_method not in EXPLAIN_METHODS:
    raise ValueError(f"attention {spec.name!r}: explain_method={spec.explain_method!r}; "
                     f"expected one of {list(EXPLAIN_METHODS)}")
  REGISTRY[spec.name] = spec
  return spec


def get(name: str) -> AttentionSpec:
  """Looks up a variant by name.

  Raises:
    ValueError: for an unknown name; the message lists the known ones and
      names the config field ``model.attention``.
  """
  try:
    return REGISTRY[name]
  except KeyError:
    raise ValueError(f"unknown attention {name!r} (config field model.attention); "
                     f"known: {', '.join(sorted(REGISTRY))}") from None


def names() -> list[str]:
  """All registered variant names, sorted."""
  return sorted(REGISTRY)


_SIMPLETRON = "Yorsh et al., SimpleTRON (2021)"
# Simple is exact under length padding only with the pads masked and the real-token count.
_SIMPLE_EXACT = {"normalizer": "real", "mask_pads": True}
# The masking fix of LRA's linear, Performer and Linformer, present so that
# --config.model.attention_kwargs.lra_masking=True switches LRA's missing mask on.
_LRA_MASKING = {"lra_masking": False}
# Present so that --config.model.attention_kwargs.lra_bugs=True switches LRA's bugs on.
_LRA_BUGS_OFF = {"lra_bugs": False}
register(AttentionSpec("softmax", SoftmaxAttention, quadratic=True,
                       paper="Vaswani et al. (2017); LRA Transformer",
                       length_padding_exact=True, lra_model_type="transformer",
                       # query AND key mask: pad rows uniform
                       lra_bug_options={"lra_masking": True},
                       explain_method="softmax_weights"))
for _name, _fixed, _double in (("simple", {"use_output_proj": False}, False),
                               ("simple_res", {"use_output_proj": False}, True),
                               ("simple_resl", {"use_output_proj": True}, True)):
  register(AttentionSpec(_name, SimpleAttention, _fixed, double_skip=_double,
                         paper=_SIMPLETRON, length_padding_exact=True,
                         padding_exact_options=_SIMPLE_EXACT,
                         explain_method="implicit_exact"))
register(AttentionSpec("linear", LinearAttention,
                       paper="Katharopoulos et al., Transformers are RNNs (2020)",
                       length_padding_exact=True, lra_model_type="linear_transformer",
                       lra_options=_LRA_MASKING,
                       lra_bug_options={"lra_masking": True},   # no padding mask at all
                       explain_method="implicit_exact"))
# LRA's Performer: ``models/performer/performer.py``'s default
# ``make_fast_generalized_attention``, deterministic ``relu(x) + 0.001`` (ListOps's record
# has ``listops/configs/performer_base.py``'s FAVOR+ softmax).
register(AttentionSpec("performer", PerformerAttention,
                       paper="Choromanski et al., Rethinking Attention with Performers (2021)",
                       length_padding_exact=True, lra_model_type="performer",
                       lra_options={"kernel": "relu_deterministic", **_LRA_MASKING},
                       # + features seeded from sum(q)
                       lra_bug_options={"lra_masking": True, "lra_bugs": True},
                       explain_method="implicit_exact"))
_AFT = "Zhai et al., An Attention Free Transformer (2021)"
register(AttentionSpec("aft_full", AFTAttention, {"variant": "full"}, quadratic=True,
                       paper=_AFT, follows_max_length=True))
register(AttentionSpec("aft_simple", AFTAttention, {"variant": "simple"}, paper=_AFT,
                       length_padding_exact=True))
register(AttentionSpec("aft_local", AFTAttention, {"variant": "local"}, paper=_AFT,
                       follows_max_length=True))
# LRA's Linformer: ``low_rank_features=16`` (``models/linformer/linformer_attention.py``
# default; the text config's 32 is a top-level field its train.py never passes).
register(AttentionSpec("linformer", LinformerAttention,
                       paper="Wang et al., Linformer (2020)", follows_max_length=True,
                       lra_model_type="linformer", lra_options={"k": 16, **_LRA_MASKING},
                       lra_bug_options={"lra_masking": True}))

# --- LRA block and sparse baselines (local, sparse, longformer, bigbird) -----------------
from simpletron_jax.model.attention.bigbird import BigBirdAttention  # noqa: E402
from simpletron_jax.model.attention.local import LocalAttention  # noqa: E402
from simpletron_jax.model.attention.longformer import LongformerAttention  # noqa: E402
from simpletron_jax.model.attention.sparse import SparseAttention  # noqa: E402

register(AttentionSpec("local", LocalAttention,
                       paper="LRA local attention (Tay et al., Long Range Arena, 2021)",
                       lra_model_type="local", lra_options=_LRA_BUGS_OFF,
                       lra_bug_options={"lra_bugs": True}))
register(AttentionSpec("sparse", SparseAttention,
                       paper="Child et al., Sparse Transformers, fixed pattern (2019)",
                       lra_model_type="sparse_transformer", lra_options=_LRA_BUGS_OFF,
                       lra_bug_options={"lra_bugs": True}))
register(AttentionSpec("longformer", LongformerAttention,
                       paper="Beltagy et al., Longformer (2020)", lra_model_type="longformer",
                       # pad query rows uniform over every position
                       lra_bug_options={"lra_bugs": True}))
# BigBird lays its pattern (global last block, random blocks) out on LRA's padded length.
register(AttentionSpec("bigbird", BigBirdAttention,
                       paper="Zaheer et al., Big Bird (2020)", follows_max_length=True,
                       lra_model_type="bigbird", lra_options=_LRA_BUGS_OFF,
                       # appended keys real, pad rows zero, no dropout
                       lra_bug_options={"lra_bugs": True}))

# --- LRA sinkhorn, synthesizer and reformer baselines ------------------------------------
from simpletron_jax.model.attention.reformer import ReformerAttention  # noqa: E402
from simpletron_jax.model.attention.sinkhorn import SinkhornAttention  # noqa: E402
from simpletron_jax.model.attention.synthesizer import (  # noqa: E402
    DenseSynthesizerAttention, RandomSynthesizerAttention)

register(AttentionSpec("sinkhorn", SinkhornAttention,
                       paper="Tay et al., Sparse Sinkhorn Attention (2020)",
                       follows_max_length=True, lra_model_type="sinkhorn",
                       lra_bug_options={"lra_bugs": True}))
_SYNTHESIZER = "Tay et al., Synthesizer (2021)"
# LRA's ``models/synthesizer/synthesizer.py`` defaults to random logits plus the dot
# product (``synthesizer_mode='random'``, ``ignore_dot_product=False``); the text config's
# factorized settings are top-level fields, never passed. The dense form LRA never ran.
register(AttentionSpec("synthesizer", DenseSynthesizerAttention, quadratic=True,
                       paper=_SYNTHESIZER, follows_max_length=True,
                       lra_model_type="synthesizer"))
register(AttentionSpec("synthesizer_random", RandomSynthesizerAttention, quadratic=True,
                       paper=_SYNTHESIZER, follows_max_length=True,
                       lra_model_type="synthesizer", lra_options={"dot_product": True},
                       lra_bug_options={"lra_bugs": True}))
# LRA's ``models/reformer/reformer_attention.py``: ``n_buckets=10`` chunks per round and no
# output projection are the module's defaults; its ``qkv_dim`` is ``emb_dim`` (set by
# ``configs/lra.make_config``): LRA's module takes ``qkv_features`` from the input width.
register(AttentionSpec("reformer", ReformerAttention,
                       paper="Kitaev et al., Reformer: The Efficient Transformer (2020)",
                       lra_model_type="reformer", lra_options=_LRA_BUGS_OFF,
                       lra_bug_options={"lra_bugs": True}))
