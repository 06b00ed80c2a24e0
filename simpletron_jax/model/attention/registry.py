"""The attention registry: each variant's :class:`AttentionSpec`, registered in its own file.

A variant's file defines its module (a :class:`base.Attention`) and, beside it, calls
:func:`register` with its spec; :mod:`simpletron_jax.model.attention` imports every module of
the package, so a new attention is one new file (plus its ``configs/<task>/<name>.py``;
docs/configs.md). ``get(name)`` returns the spec and ``spec.build(...)`` makes the Flax
module. A spec holds what the model needs to build and wire the variant (SimpleTRON's double
skip, the output projection), its asymptotic cost, which the tests use (a sub-quadratic
variant must never build an ``L x L`` array), and whether padding the length changes it
(``model.length_multiple``). Its experiment facts (LRA's baseline, options and bugs, the
SimpleTRON paper's variants) are :mod:`simpletron_jax.experiments.attentions`'s.
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
    module: the Flax module class, a :class:`base.Attention` (the shared fields, which
      :meth:`build` sets, then the variant's own options).
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
    output_projection: False when the variant's output is its heads side by side (no ``out``
      projection), so its configs set ``model.qkv_dim = model.emb_dim`` (Simple,
      Simple-Res; Reformer as LRA built it).
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
  these entries, and :func:`simpletron_jax.train.config_checks.check_model_and_data` names them in a
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

