"""A config file (``configs/<task>/<model>.py[:variant]``): how it is loaded and why it fails.

* :func:`import_config_package`: the package a config file lives in (``configs``) is imported
  from its folder, so ``from configs import lra`` works from any working directory without
  ``sys.path`` changing; ml_collections' loader of ``--config`` files is replaced by one that
  does so (and that works on Python 3.15, :func:`_load_source`);
* :func:`read_config`: the file's config without overrides (for an error message);
* the one-line causes :mod:`simpletron_jax.runtime.cli` and
  :mod:`simpletron_jax.runtime.overrides` print: :func:`config_file_message` (a file that does
  not exist or does not load), :func:`missing_field` (an override of a field the config
  lacks, with the nearest names).

No JAX here; nothing of the project but this module is imported.
"""

from __future__ import annotations

import difflib
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Sequence

import ml_collections
from absl import flags
from ml_collections import config_flags
from ml_collections.config_flags import config_flags as _config_flags_impl


def import_config_package(module_path: str) -> None:
  """Makes the package a config file lives in importable by its name, without ``sys.path``:
  for ``<root>/configs/listops/simple.py`` under ``<root>/configs/__init__.py``, the topmost
  folder with an ``__init__.py`` above the file (``configs``) is imported from that folder,
  unless a package of its name is imported already. So the file's ``from configs import lra``
  works from any working directory. A file outside a package: nothing.

  Raises:
    Any exception the package's ``__init__.py`` raises.
  """
  folder, top = os.path.dirname(os.path.abspath(module_path)), None
  while os.path.isfile(os.path.join(folder, "__init__.py")):
    top, folder = folder, os.path.dirname(folder)
  name = os.path.basename(top or "")
  if not name.isidentifier() or name in sys.modules:
    return
  spec = importlib.util.spec_from_file_location(name, os.path.join(top, "__init__.py"),
                                                submodule_search_locations=[top])
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  try:
    spec.loader.exec_module(module)
  except BaseException:
    sys.modules.pop(name, None)
    raise


def _load_source(module_name: str, module_path: str) -> types.ModuleType:
  """Runs a config file as ml_collections' ``config_flags`` does (any suffix, registered in
  ``sys.modules`` as ``module_name`` unless it fails) through ``exec_module``: ml_collections
  1.1.0 calls ``SourceFileLoader.load_module()``, which Python 3.15 removed (gh-97850). The
  package the file lives in is importable first (:func:`import_config_package`).

  Raises:
    FileNotFoundError: no file at ``module_path``; any exception the file raises.
  """
  import_config_package(module_path)
  loader = importlib.machinery.SourceFileLoader(module_name, module_path)
  spec = importlib.util.spec_from_loader(module_name, loader)
  module = importlib.util.module_from_spec(spec)
  sys.modules[module_name] = module
  try:
    loader.exec_module(module)
  except BaseException:
    sys.modules.pop(module_name, None)
    raise
  return module


# config_flags loads every --config file; its loader is replaced until ml_collections' is fixed.
if hasattr(_config_flags_impl, "_load_source"):
  _config_flags_impl._load_source = _load_source  # pylint: disable=protected-access


def read_config(spec: str) -> ml_collections.ConfigDict:
  """The config of ``spec`` (``path[:variant]``) as its file builds it, without overrides.

  Raises:
    flags.Error: absl's, for a file that does not load or an unknown ``:variant``;
    OSError, SyntaxError, ImportError: the file's own.
  """
  argv = ["read_config", f"--config={spec}"]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, flag_values=values, lock_config=False,
                                  sys_argv=argv)
  values(argv)
  return values.config


def config_spec(argv: Sequence[str]) -> str | None:
  """The ``--config`` value of ``argv`` (``path[:variant]``), or None when there is none."""
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      return arg[len("--config="):]
    if arg == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def config_filename(argv: Sequence[str], flag_values: flags.FlagValues) -> str:
  """The config file ``--config`` names (its ``:variant`` dropped): from the parsed flag, or
  from ``argv`` when the flag's own parsing failed (a config file that does not load);
  ``?`` when there is none."""
  try:
    return config_flags.get_config_filename(flag_values["config"])
  except Exception:  # pylint: disable=broad-except  (absl: not parsed; no such flag)
    pass
  return (config_spec(argv) or "?").split(":")[0]


def load_cause(error: BaseException) -> str:
  """The cause of a config file's failure to load, on one line: ``file:line`` and the message
  of a syntax error, else the error's type and first line (ml_collections' messages go on
  with the paths it tried)."""
  if isinstance(error, SyntaxError):
    return f"SyntaxError at {error.filename}:{error.lineno}: {error.msg}"
  first = (str(error).strip().splitlines() or [""])[0]
  return f"{type(error).__name__}: {first}"


def config_file_message(path: str, error: BaseException) -> str:
  """Why the config file ``path`` could not be loaded, with the files next to it when it does
  not exist."""
  folder = os.path.dirname(path) or "."
  if os.path.exists(path):
    return (f"--config {path}: the file cannot be loaded: {load_cause(error)}; fix the "
            "file, or pass another config")
  known = ""
  if os.path.isdir(folder):
    names = sorted(f for f in os.listdir(folder) if f.endswith(".py") and f != "__init__.py")
    known = f"; the configs in {folder}: {', '.join(names)}" if names else ""
  return (f"--config {path}: no such config file{known}. Configs are "
          "configs/<task>/<attention>.py[:variant], e.g. configs/listops/simple.py:tiny")


def config_fields(config, prefix: str = "") -> list[str]:
  """The dotted names of every field of a ConfigDict (sections included)."""
  names = []
  for key, value in (config.items() if hasattr(config, "items") else ()):
    names.append(f"{prefix}{key}")
    if hasattr(value, "items"):
      names += config_fields(value, f"{prefix}{key}.")
  return names


def missing_field(config, field: str) -> tuple[str, str, list[str]] | None:
  """The first part of the dotted ``field`` that ``config`` (a ConfigDict or dict) lacks:
  ``(section, part, close)``, the dotted section it is missing from (``""``: the top), the
  part, and the nearest existing names in that section, dotted; None when it has them all."""
  node, path = config, []
  for part in field.split("."):
    if not hasattr(node, "keys") or part not in node:
      known = list(node.keys()) if hasattr(node, "keys") else []
      section = ".".join(path)
      return section, part, [f"{section}.{c}" if section else c
                             for c in difflib.get_close_matches(part, known, n=3)]
    path.append(part)
    node = node[part]
  return None
