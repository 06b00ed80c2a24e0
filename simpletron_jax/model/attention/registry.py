"""The attention registry: each variant's :class:`AttentionSpec`, registered in its own file.

``get(name)`` returns the spec and ``spec.build(...)`` the Flax module. A spec holds what the
model needs (SimpleTRON's double skip, the output projection, padding exactness) and the
cost the tests check; experiment facts are :mod:`simpletron_jax.experiments.attentions`'s.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn

from simpletron_jax.model.attention import base

# Constructor arguments the encoder block passes to every variant (not config options).
ENCODER_ARGS = ("num_heads", "qkv_dim", "out_dim", "dropout_rate", "dtype", "num_queries",
                "use_bias", "dense_init")


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
  """How to build and wire one registered attention variant.

  Attributes:
    name: registry key, e.g. ``"simple_res"``.
    module: the :class:`base.Attention` subclass.
    fixed_kwargs: constructor arguments that define the variant.
    double_skip: the encoder block adds SimpleTRON's second skip,
      ``out = x1 + MLP(LN(x1)) + x0`` (Simple-Res, paper Table 1).
    quadratic: time or memory grows as L^2 (exempt from the no-``L x L`` test).
    paper: the source of the variant.
    length_padding_exact: masked positions appended after the last token change nothing
      (``model.length_multiple`` is allowed): a masked sum over all keys, with no blocks,
      chunks, hashing or length-sized weights.
    padding_exact_options: option values ``length_padding_exact`` needs (Simple's
      ``normalizer``, ``mask_pads``).
    output_projection: False when the heads side by side are the output, so configs set
      ``model.qkv_dim = model.emb_dim``.
  """

  name: str
  module: type[nn.Module]
  fixed_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  double_skip: bool = False
  quadratic: bool = False
  paper: str = ""
  length_padding_exact: bool = False
  padding_exact_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  output_projection: bool = True

  def padding_inexact_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
    """The ``options`` (absent: their defaults) that break :attr:`padding_exact_options`."""
    defaults = self.options()
    return {k: options.get(k, defaults.get(k)) for k, v in self.padding_exact_options.items()
            if options.get(k, defaults.get(k)) != v}

  def module_fields(self) -> set[str]:
    """The module's constructor fields (``parent`` and ``name`` excluded)."""
    return {f.name for f in dataclasses.fields(self.module)} - {"parent", "name"}

  def options(self) -> dict[str, Any]:
    """The options a config may set in ``model.attention_kwargs``, with their defaults.

    Not :data:`ENCODER_ARGS` nor ``fixed_kwargs``; ``configs/lra.make_config`` stores them so that
    ``--config.model.attention_kwargs.<option>=...`` works.
    """
    skip = set(ENCODER_ARGS) | set(self.fixed_kwargs) | {"parent", "name"}
    return {f.name: f.default for f in dataclasses.fields(self.module)
            if f.name not in skip and f.default is not dataclasses.MISSING}

  def build(self, *, num_heads: int, qkv_dim: int, out_dim: int, dropout_rate: float,
            dtype, name: str | None = None, use_bias: bool = True, dense_init: str = "lra",
            **kwargs) -> nn.Module:
    """The unbound module, called ``(x_BxLxE, mask_BxL, deterministic)``.

    ``kwargs`` are ``model.attention_kwargs``; those :func:`inherited_options` finds are dropped.

    Raises:
      ValueError: if ``kwargs`` changes a ``fixed_kwargs`` entry or names an unknown field.
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
  """Entries of ``kwargs`` that ``name``'s module lacks and another variant has as its default.

  A config switched with ``--config.model.attention=NAME`` still holds its old attention's
  options; :meth:`AttentionSpec.build` drops these and ``config_checks`` warns. ``{option:
  value}``, empty for a config made for ``name``.

  Raises:
    ValueError: for an unknown ``name``.
  """
  own = {f.name for f in dataclasses.fields(get(name).module)}
  return {k: v for k, v in kwargs.items() if k not in own and any(
      k in spec.options() and spec.options()[k] == v and type(spec.options()[k]) is type(v)
      for spec in REGISTRY.values())}


def register(spec: AttentionSpec) -> AttentionSpec:
  """Adds ``spec`` under ``spec.name``.

  Raises:
    ValueError: if the name is taken, or ``spec.module`` is not a :class:`base.Attention`.
  """
  if not (isinstance(spec.module, type) and issubclass(spec.module, base.Attention)):
    raise ValueError(f"attention {spec.name!r}: its module {spec.module!r} must subclass "
                     "simpletron_jax.model.attention.base.Attention")
  if spec.name in REGISTRY:
    raise ValueError(f"attention {spec.name!r} is already registered")
  REGISTRY[spec.name] = spec
  return spec


def get(name: str) -> AttentionSpec:
  """The spec named ``name``.

  Raises:
    ValueError: naming ``model.attention`` and the known names, for an unknown one.
  """
  try:
    return REGISTRY[name]
  except KeyError:
    raise ValueError(f"unknown attention {name!r} (config field model.attention); "
                     f"known: {', '.join(sorted(REGISTRY))}") from None


def names() -> list[str]:
  """All registered variant names, sorted."""
  return sorted(REGISTRY)

