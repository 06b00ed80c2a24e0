"""The attention registry: every variant by name, with the call of :mod:`simpletron_jax.attention.base`.

``get(name)`` returns an :class:`AttentionSpec`; ``spec.build(...)`` makes the
Flax module. A spec also tells the encoder block how to wire the variant
(SimpleTRON's double skip) and records its asymptotic cost, which the tests
use (a sub-quadratic variant must never build an ``L x L`` array).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn

from simpletron_jax.attention.aft import AFTAttention
from simpletron_jax.attention.linear import LinearAttention
from simpletron_jax.attention.linformer import LinformerAttention
from simpletron_jax.attention.performer import PerformerAttention
from simpletron_jax.attention.simple import SimpleAttention
from simpletron_jax.attention.softmax import SoftmaxAttention


# Constructor arguments the encoder block passes to every variant (not config options).
ENCODER_ARGS = ("num_heads", "qkv_dim", "out_dim", "dropout_rate", "dtype", "num_queries",
                "use_bias", "dense_init")


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
  """

  name: str
  module: type[nn.Module]
  fixed_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  double_skip: bool = False
  quadratic: bool = False
  paper: str = ""

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
        field the module does not have. An option of another registered variant
        left at that variant's default is dropped instead: a config switched to
        this variant with ``--config.model.attention`` keeps the old one's defaults.
    """
    clash = set(kwargs) & set(self.fixed_kwargs)
    if clash:
      raise ValueError(f"model.attention_kwargs may not set {sorted(clash)} for attention "
                       f"{self.name!r}; they define the variant")
    fields = {f.name for f in dataclasses.fields(self.module)}
    # Another variant's option at its default (left by --config.model.attention=...).
    inherited = {k for k in set(kwargs) - fields if _default_elsewhere(k, kwargs[k])}
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


def _default_elsewhere(option: str, value: Any) -> bool:
  """True when some registered variant has ``option`` with default ``value``."""
  return any(option in spec.options() and spec.options()[option] == value
             and type(spec.options()[option]) is type(value) for spec in REGISTRY.values())


def register(spec: AttentionSpec) -> AttentionSpec:
  """Adds ``spec`` under ``spec.name``.

  Raises:
    ValueError: if the name is taken.
  """
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


_SIMPLETRON = "Yorsh et al., SimpleTRON (2021)"
register(AttentionSpec("softmax", SoftmaxAttention, quadratic=True,
                       paper="Vaswani et al. (2017); LRA Transformer"))
register(AttentionSpec("simple", SimpleAttention, {"use_output_proj": False},
                       paper=_SIMPLETRON))
register(AttentionSpec("simple_res", SimpleAttention, {"use_output_proj": False},
                       double_skip=True, paper=_SIMPLETRON))
register(AttentionSpec("simple_resl", SimpleAttention, {"use_output_proj": True},
                       double_skip=True, paper=_SIMPLETRON))
register(AttentionSpec("linear", LinearAttention,
                       paper="Katharopoulos et al., Transformers are RNNs (2020)"))
register(AttentionSpec("performer", PerformerAttention,
                       paper="Choromanski et al., Rethinking Attention with Performers (2021)"))
_AFT = "Zhai et al., An Attention Free Transformer (2021)"
register(AttentionSpec("aft_full", AFTAttention, {"variant": "full"}, quadratic=True,
                       paper=_AFT))
register(AttentionSpec("aft_simple", AFTAttention, {"variant": "simple"}, paper=_AFT))
register(AttentionSpec("aft_local", AFTAttention, {"variant": "local"}, paper=_AFT))
register(AttentionSpec("linformer", LinformerAttention,
                       paper="Wang et al., Linformer (2020)"))

# --- LRA block and sparse baselines (local, sparse, longformer, bigbird) -----------------
from simpletron_jax.attention.bigbird import BigBirdAttention  # noqa: E402
from simpletron_jax.attention.local import LocalAttention  # noqa: E402
from simpletron_jax.attention.longformer import LongformerAttention  # noqa: E402
from simpletron_jax.attention.sparse import SparseAttention  # noqa: E402

register(AttentionSpec("local", LocalAttention,
                       paper="LRA local attention (Tay et al., Long Range Arena, 2021)"))
register(AttentionSpec("sparse", SparseAttention,
                       paper="Child et al., Sparse Transformers, fixed pattern (2019)"))
register(AttentionSpec("longformer", LongformerAttention,
                       paper="Beltagy et al., Longformer (2020)"))
register(AttentionSpec("bigbird", BigBirdAttention,
                       paper="Zaheer et al., Big Bird (2020)"))

# --- LRA sinkhorn, synthesizer and reformer baselines ------------------------------------
from simpletron_jax.attention.reformer import ReformerAttention  # noqa: E402
from simpletron_jax.attention.sinkhorn import SinkhornAttention  # noqa: E402
from simpletron_jax.attention.synthesizer import (  # noqa: E402
    DenseSynthesizerAttention, RandomSynthesizerAttention)

register(AttentionSpec("sinkhorn", SinkhornAttention,
                       paper="Tay et al., Sparse Sinkhorn Attention (2020)"))
_SYNTHESIZER = "Tay et al., Synthesizer (2021)"
register(AttentionSpec("synthesizer", DenseSynthesizerAttention, quadratic=True,
                       paper=_SYNTHESIZER))
register(AttentionSpec("synthesizer_random", RandomSynthesizerAttention, quadratic=True,
                       paper=_SYNTHESIZER))
register(AttentionSpec("reformer", ReformerAttention,
                       paper="Kitaev et al., Reformer: The Efficient Transformer (2020)"))
