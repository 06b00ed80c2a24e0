"""The attention variants, one file each, registered beside its module (docs/configs.md).

Importing the package imports every module, so each registers its :class:`AttentionSpec`;
:mod:`~simpletron_jax.model.attention.registry` holds them.
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
