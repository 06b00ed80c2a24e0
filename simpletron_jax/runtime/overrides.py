"""One override syntax for every script: ``--config.<field>=<value>``, as ``train.py`` takes it.

``train.py`` parses its overrides with ml_collections' config flags (absl). The scripts take
the same arguments: ``scripts/seeds.py`` passes them on to ``train.py``, and
``scripts/variant_table.py``, ``scripts/spt.py``, ``scripts/experiments/*`` and
``python -m simpletron_jax.data`` parse them here, with the same config flags:

* :class:`OverrideParser` is an ``argparse.ArgumentParser`` that does that first and keeps
  the overrides as ``args.config_overrides``;
* :func:`split_overrides` takes the ``--config.<field>=<value>`` (or ``--config.<field>
  <value>``) arguments out of a command line, so that argparse sees the rest;
* :func:`apply_overrides` applies them to a ConfigDict through
  ``config_flags.DEFINE_config_dict``, so a value is parsed by the type of the field it sets,
  exactly as ``train.py`` parses it (``--config.model.max_length=256`` is an int,
  ``--config.data.data_dir=~/d`` a string, ``--config.model.attention_kwargs.block_diagonal=True``
  a bool);
* :func:`load_config` loads ``configs/<task>/<model>.py[:variant]`` with overrides: the config
  ``train.py --config ... <overrides>`` trains (so a script can check a finished run's
  ``config_fingerprint`` before reusing it).

An override of a field the config lacks raises a ``ValueError`` whose one line names the first
missing part of the path and the nearest existing names; a value the field's type refuses,
one naming the override and absl's reason.

No JAX here.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

import ml_collections

from simpletron_jax.runtime import cli, config_files

PREFIX = "--config."
"""What an override starts with."""


def split_overrides(argv: Sequence[str], prefix: str = PREFIX) -> tuple[list[str], list[str]]:
  """Separates the config overrides from the other arguments of a command line.

  Args:
    argv: the arguments (without the program name).
    prefix: what an override starts with: ``--config.`` (every script), or another stage's
      prefix such as ``--spt_config.`` (``scripts/spt.py``'s pretraining-only overrides).

  Returns:
    ``(rest, overrides)``: the other arguments in order, and each override as one
    ``--config.<field>=<value>`` string (``prefix`` replaced by ``--config.``; the two-word
    form ``--config.<field> <value>`` joined). An override followed by another flag or by
    nothing is kept as it is (absl reads ``--config.<bool field>`` alone as True).

  Raises:
    ValueError: for ``prefix`` alone (no field name).
  """
  rest: list[str] = []
  found: list[str] = []
  argv = list(argv)
  i = 0
  while i < len(argv):
    arg = argv[i]
    if not arg.startswith(prefix):
      rest.append(arg)
      i += 1
      continue
    body = arg[len(prefix):]
    if not body or body.startswith("="):
      raise ValueError(f"{arg!r}: an override names a field, e.g. {prefix}num_train_steps=300")
    if "=" not in body and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
      body = f"{body}={argv[i + 1]}"
      i += 1
    found.append(PREFIX + body)
    i += 1
  return rest, found


def old_syntax(argv: Sequence[str], flags: Sequence[str]) -> str | None:
  """A one-line hint when ``argv`` uses a retired override flag (``--override``, ``--set``,
  ...) in ``flags``: the same override in today's syntax; None otherwise."""
  for i, arg in enumerate(argv):
    name, _, inline = arg.partition("=")
    if name in flags:
      value = inline or (argv[i + 1] if i + 1 < len(argv) else "FIELD=VALUE")
      new = PREFIX if name in ("--override", "--set") else "--spt_config."
      return (f"{name} {value} is written {new}{value} now (the syntax of train.py: "
              f"{PREFIX}<field>=<value>)")
  return None


class OverrideParser(cli.ArgumentParser):
  """An ``ArgumentParser`` that first takes the ``--config.<field>=<value>`` overrides out of
  the command line (:func:`split_overrides`) and stores them, in order, as
  ``args.config_overrides``. Its other flags follow the project's style
  (:class:`simpletron_jax.runtime.cli.ArgumentParser`: underscores, a dashed spelling accepted
  with a deprecation note, plain ``--help``).

  Args:
    old_flags: retired override flags (``--override``, ``--set``) answered with the same
      override in today's syntax (:func:`old_syntax`).
    **kwargs: ``argparse.ArgumentParser``'s.
  """

  def __init__(self, *args, old_flags: Sequence[str] = (), **kwargs):
    super().__init__(*args, **kwargs)
    self.old_flags = tuple(old_flags)

  def parse_known_args(self, args=None, namespace=None):  # pylint: disable=signature-differs
    """As argparse's, with ``config_overrides`` set on the namespace.

    Raises:
      SystemExit: a bad invocation, one line and status 1
        (:meth:`simpletron_jax.runtime.cli.ArgumentParser.error`), also for an override without
        a field name or a retired flag.
    """
    args = sys.argv[1:] if args is None else list(args)
    hint = old_syntax(args, self.old_flags)
    if hint:
      self.error(hint)
    try:
      rest, found = split_overrides(args)
    except ValueError as e:
      self.error(str(e))
    namespace, extra = super().parse_known_args(rest, namespace)
    namespace.config_overrides = found
    return namespace, extra


def _parse(flag_values, argv: list[str]) -> None:
  """absl's parse of ``argv`` into ``flag_values``; a refused override raises ValueError."""
  try:
    cli.parse_flags(argv, "overrides", flag_values)
  except SystemExit as e:   # cli's one line, "overrides: <cause>"
    message = str(e.code)
    message = message[len("overrides: "):] if message.startswith("overrides: ") else message
    raise ValueError(message.removesuffix(" (see --help)")) from None


def _missing_field_message(config: ml_collections.ConfigDict, error: BaseException,
                           overrides: Sequence[str]) -> str:
  """One line for an override of a field the config lacks, naming the first missing part of
  its path and the nearest existing names."""
  for override in overrides:
    missing = config_files.missing_field(config, override[len(PREFIX):].split("=", 1)[0])
    if missing:
      section, part, close = missing
      hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
      return (f"the config has no field {(f'{section}.' if section else '') + part!r}{hint}; "
              f"{override.split('=', 1)[0]} sets existing fields only, e.g. "
              "--config.num_train_steps=300")
  return f"an override was refused: {' '.join(str(error).split())}"


def apply_overrides(config: ml_collections.ConfigDict,
                    overrides: Sequence[str]) -> ml_collections.ConfigDict:
  """Applies ``--config.<field>=<value>`` overrides to ``config``, in place, as ``train.py``
  parses them (ml_collections' config flags: the value is read by the field's type).

  Args:
    config: the config; its lock state is kept.
    overrides: from :func:`split_overrides` (each must start with ``--config.``).

  Returns:
    ``config`` (the same object), overridden.

  Raises:
    ValueError: one line, for an argument that is not an override, a field the config
      lacks (with the nearest names) or a value its type refuses.
  """
  overrides = list(overrides)
  if not overrides:
    return config
  bad = [o for o in overrides if not o.startswith(PREFIX)]
  if bad:
    raise ValueError(f"not a config override: {bad[0]!r}; write {PREFIX}<field>=<value>")
  from absl import flags  # pylint: disable=import-outside-toplevel
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel
  was_locked = config.is_locked
  argv = ["overrides", *overrides]
  values = flags.FlagValues()
  try:
    try:   # the override flags are typed by the config's fields when they are defined
      config_flags.DEFINE_config_dict("config", config, flag_values=values, lock_config=True,
                                      sys_argv=argv)
    except (AttributeError, KeyError) as e:
      raise ValueError(_missing_field_message(config, e, overrides)) from None
    _parse(values, argv)
  finally:
    if not was_locked:
      config.unlock()
  return config


def config_path(spec: str) -> str:
  """The file of a ``--config`` spec (``path[:variant]``): absolute as given, else relative to
  the working directory when it exists there, else to the repository root."""
  path = spec.split(":", 1)[0]
  if os.path.isabs(path) or os.path.exists(path):
    return path
  return os.path.join(cli.REPO_ROOT, path)


def load_config(spec: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
  """The config ``train.py --config <spec> <overrides>`` trains.

  Args:
    spec: ``configs/<task>/<model>.py[:variant]`` (see :func:`config_path`).
    overrides: ``--config.<field>=<value>`` arguments.

  Returns:
    The ConfigDict (unlocked).

  Raises:
    ValueError: one line, for a missing config file, an unknown ``:variant`` (with the known
      ones), or a refused override (see :func:`apply_overrides`).
  """
  from absl import flags  # pylint: disable=import-outside-toplevel
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel
  bad = [o for o in overrides if not o.startswith(PREFIX)]
  if bad:
    raise ValueError(f"not a config override: {bad[0]!r}; write {PREFIX}<field>=<value>")
  _, colon, variant = spec.partition(":")
  path = config_path(spec)
  if not os.path.isfile(path):
    raise ValueError(f"--config {spec}: no such config file ({path}); configs are "
                     "configs/<task>/<model>.py[:variant], e.g. configs/listops/simple.py:tiny")
  config_files.import_config_package(path)   # the config files import configs.lra
  argv = ["load_config", f"--config={path}{colon}{variant}"]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, flag_values=values, lock_config=False,
                                  sys_argv=argv)
  _parse(values, argv)
  return apply_overrides(values.config, overrides)
