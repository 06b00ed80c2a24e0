"""The attention variants: one file each, registered beside its module.

Each module of this package but :mod:`~simpletron_jax.model.attention.base` and
:mod:`~simpletron_jax.model.attention.registry` defines one attention (a
:class:`base.Attention`) and registers its :class:`AttentionSpec` (or, for a family built
from one module, several) with :func:`register`. Importing the package imports all of them,
so a new attention is one new file here plus its ``configs/<task>/<name>.py`` files
(docs/configs.md). ``get(name)`` returns a spec and ``spec.build(...)`` makes the Flax module;
the registry is :mod:`~simpletron_jax.model.attention.registry`.
"""

from __future__ import annotations

import importlib
import pkgutil

from simpletron_jax.model.attention.registry import (ENCODER_ARGS, REGISTRY, AttentionSpec,
                                                     get, inherited_options, names, register)

__all__ = ["ENCODER_ARGS", "REGISTRY", "AttentionSpec", "get", "inherited_options", "names",
           "register"]

for _module in pkgutil.iter_modules(__path__):
  importlib.import_module(f"{__name__}.{_module.name}")
