"""The task registry: one record per task (:class:`TaskSpec`), registered by the task's own
module, and :func:`load_task`.

A record holds a task's data facts: its reader (:class:`DataConfig` ``->`` :class:`TaskData`),
vocabulary and classes, ``max_length``, the reader's ``config.data`` fields, and its data
command: how ``python -m simpletron_jax.data where|prepare|verify`` finds, prepares and
checks its files (:mod:`simpletron_jax.data.prepare`) and how ``scripts/explain.py`` shows
its tokens. Each task's module (:mod:`simpletron_jax.data.listops`, ``text``, ``retrieval``,
``image``, ``pathfinder``, ``agnews``) registers its record when ``simpletron_jax.data`` is
imported, so every reader of the registry sees them all. The experiment facts (the published
models and recipes, LRA's baseline settings, the published accuracies) are
:mod:`simpletron_jax.experiments`'s. ``get(name)`` returns a record, ``names()`` the tasks;
docs/tasks.md says how to add one.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, Mapping

import ml_collections
import numpy as np

from simpletron_jax.data.common import PairedExamples, RaggedExamples
from simpletron_jax.data.sources import Check, Download, Where
from simpletron_jax.data.tfds_io import find_prepared_tfds

DEFAULT_CACHE = os.path.join("~", ".cache", "simpletron_jax")
DEFAULT_TFDS_DATA_DIR = os.path.join("~", "tensorflow_datasets")
"""tfds's own default data dir, used when ``$TFDS_DATA_DIR`` is unset."""
DEFAULT_DATA_ROOT = os.path.join("~", "data")
"""Where ``python -m simpletron_jax.data prepare`` writes by default (``--dest``): the loaders
search ``~/data/imdb``, ``~/data/cifar10``, ``~/data/lra_release`` (AAN) and
``~/data/ag_news_csv`` when ``data.data_dir`` is unset."""
SHOWN = ("tokens", "bytes", "pixels")
"""How ``scripts/explain.py`` draws a task's tokens (:attr:`TaskSpec.shown`)."""


@dataclasses.dataclass(frozen=True)
class TaskData:
  """The three splits of a classification task and its sizes.

  Attributes:
    train, val, test: the splits; :class:`PairedExamples` for two-document tasks
      (retrieval), which the trainer feeds to the dual encoder.
    vocab_size: token ids lie in ``[0, vocab_size)``; 0 is padding.
    num_classes: number of labels.
    source: where the data came from (a directory), for the logs.
  """

  train: RaggedExamples | PairedExamples
  val: RaggedExamples | PairedExamples
  test: RaggedExamples | PairedExamples
  vocab_size: int
  num_classes: int
  source: str


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """A task's data facts and data command; :func:`load_task`, the configs
  (``configs/lra.py``), ``tpu_aot``, ``config_checks`` and the data command read it
  (docs/tasks.md). The callables take the task's :class:`DataConfig` (``data``).

  Attributes:
    name: the registry key, ``config.task`` and the folder ``configs/<name>/``.
    reader: ``data -> TaskData``: loads (or generates) the three splits.
    vocab_size: token ids lie in ``[0, vocab_size)``, 0 padding; None when the reader's
      tokenizer decides it (``agnews``: the BERT vocabulary of ``data.vocab_path``).
    num_classes: labels.
    max_length: the published ``model.max_length`` (tokens per document, CLS excluded).
    find: ``data -> Where``: where the reader reads from under ``data``, by the reader's
      own search (``ready=False``: generated on first use); raises ``FileNotFoundError``
      when the data is missing.
    prepare: ``(data, source, dest, num_workers, log) -> Where | None``: puts the data in
      place from ``source`` (``--from``: a download or the folder it was unpacked to, or
      None) under ``dest`` (or the cache, for generated data), writing a manifest; None when
      there is nothing to make without a source.
    check: ``(data, found) -> [(status, line)]``: ``verify``'s checks of the data
      ``find`` found (counts, labels, files), beyond the manifest's checksums.
    download: the public file ``prepare --from`` takes (None: none).
    generated: ``data -> [data]``: for data generated into the cache, the settings of each
      set there (each size found), which ``verify`` without ``--config`` checks; None when
      the task generates nothing.
    shown: how ``scripts/explain.py`` draws the tokens (:data:`SHOWN`): ``tokens`` (spaced
      words), ``bytes`` (running text) or ``pixels`` (an image).
    dual: two documents per example (retrieval's dual encoder).
    lra: one of LRA's six tasks (Tay et al., ICLR 2021); they are registered in the order of
      LRA's Table 1, which :func:`lra_tasks` keeps.
    data_options: the reader's ``config.data`` fields with their defaults, each written
      here once; a type (``str``, ``bool``) makes an unset field (None) of that type.
  """

  name: str
  reader: Callable[[DataConfig], TaskData]
  vocab_size: int | None
  num_classes: int
  max_length: int
  find: Callable[[DataConfig], Where]
  prepare: Callable[[DataConfig, str | None, str, int | None, Callable[[str], None]],
                    Where | None]
  check: Callable[[DataConfig, Where], list[Check]]
  download: Download | None = None
  generated: Callable[[DataConfig], list[DataConfig]] | None = None
  shown: str = "tokens"
  dual: bool = False
  lra: bool = True
  data_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @functools.cached_property
  def options(self) -> dict[str, Any]:
    """Every ``config.data`` field of the task but ``seed``: :data:`SHARED_DATA_OPTIONS`,
    then ``data_options`` (which may change a shared default), with their defaults."""
    return {**SHARED_DATA_OPTIONS, **self.data_options}

  @functools.cached_property
  def settings(self) -> type[DataConfig]:
    """The task's frozen :class:`DataConfig` subclass: one field per :attr:`options` entry,
    at its default (None for a type)."""
    fields = [(name, _kind(default), dataclasses.field(
        default=None if isinstance(default, type) else default))
              for name, default in self.options.items()]
    return dataclasses.make_dataclass(
        f"{self.name.title()}DataConfig", fields, bases=(DataConfig,), frozen=True,
        namespace={"__doc__": f"The {self.name} task's data settings (:class:`DataConfig`)."})


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """A task's data settings, typed and checked, built once from the config by
  :func:`data_config`; the readers and the data command take it. Each task's subclass
  (:attr:`TaskSpec.settings`) adds its ``config.data`` fields (:attr:`TaskSpec.options`:
  folders, the generator's arguments, LRA's options), at the record's default where a config
  lacks one (an older run's ``config.json``).

  Attributes:
    task: ``config.task``.
    max_length: ``model.max_length``, tokens per document (CLS excluded).
    seed: ``data.seed`` (the seeded train/val splits and the generators).
  """
  task: str
  max_length: int
  seed: int

  def folder(self, field: str) -> str | None:
    """The folder field ``field`` (``data_dir``, ``tfds_data_dir``) expanded, or None when
    unset or not a field of the task."""
    path = getattr(self, field, None)
    return os.path.expanduser(path) if path else None

  @property
  def cache(self) -> str:
    """The data cache: ``data.cache_dir``, else ``$SIMPLETRON_JAX_CACHE``, else
    ``~/.cache/simpletron_jax`` (expanded)."""
    path = self.cache_dir or os.environ.get("SIMPLETRON_JAX_CACHE") or DEFAULT_CACHE
    return os.path.expanduser(path)


REGISTRY: dict[str, TaskSpec] = {}


def register(spec: TaskSpec) -> TaskSpec:
  """Adds ``spec`` under ``spec.name``.

  Raises:
    ValueError: if the name is taken, or ``shown`` is not one of :data:`SHOWN`.
  """
  if spec.name in REGISTRY:
    raise ValueError(f"task {spec.name!r} is already registered")
  if spec.shown not in SHOWN:
    raise ValueError(f"task {spec.name!r}: shown={spec.shown!r}; expected one of {SHOWN}")
  REGISTRY[spec.name] = spec
  return spec


def get(name: str) -> TaskSpec:
  """The record of task ``name``.

  Raises:
    ValueError: one line naming the config field ``task`` and the known tasks.
  """
  try:
    return REGISTRY[name]
  except (KeyError, TypeError):
    raise ValueError(f"task={name!r} is not a task; known: "
                     f"{', '.join(sorted(REGISTRY))}") from None


def names() -> tuple[str, ...]:
  """Every registered task, in registration order (LRA's six first, in Table 1's order)."""
  return tuple(REGISTRY)


def lra_tasks() -> tuple[str, ...]:
  """LRA's tasks, in the order of LRA's Table 1 (listops, text, retrieval, image,
  pathfinder, pathx)."""
  return tuple(name for name, spec in REGISTRY.items() if spec.lra)


def shown_as(kind: str) -> tuple[str, ...]:
  """The tasks whose tokens ``scripts/explain.py`` draws as ``kind`` (:data:`SHOWN`)."""
  return tuple(name for name, spec in REGISTRY.items() if spec.shown == kind)


# The ``config.data`` fields of every task, before its record's ``data_options``; a type makes
# an unset field (None) of that type, as in ``data_options``.
SHARED_DATA_OPTIONS: Mapping[str, Any] = {
    "data_dir": str,             # the reader's folder; unset: its own search
    "cache_dir": str,            # unset: $SIMPLETRON_JAX_CACHE, else ~/.cache/simpletron_jax
    "bucket": 128,               # pad each batch to a multiple of this; 0: max_length
    "group_by_length": False,    # length-grouped train batches (changes LRA's batches)
    "group_pool_batches": 50,    # batches per length-sorted pool when grouping
}


def _set_options(section: ml_collections.ConfigDict, options: Mapping[str, Any]) -> None:
  """Sets each ``name: value`` of ``options`` on ``section``; a type sets an unset field."""
  for name, value in options.items():
    section[name] = (ml_collections.config_dict.placeholder(value) if isinstance(value, type)
                     else value)


def data_section(spec: TaskSpec, seed: ml_collections.FieldReference
                 ) -> ml_collections.ConfigDict:
  """The ``config.data`` section of task ``spec`` at its defaults.

  Args:
    spec: the task's record.
    seed: the config's ``seed`` (``config.get_ref("seed")``): ``data.seed`` follows it until
      it is set itself.

  Returns:
    ``data_dir``, ``cache_dir``, ``seed``, then the rest of :attr:`TaskSpec.options`.
  """
  data = ml_collections.ConfigDict()
  _set_options(data, {name: spec.options[name] for name in ("data_dir", "cache_dir")})
  # A reference of its own that points at seed's, not seed's reference, which would make
  # --config.data.seed=1 set config.seed too (a field holding a reference passes a new value
  # to it).
  data.seed = ml_collections.FieldReference(seed, field_type=int)
  _set_options(data, {name: value for name, value in spec.options.items() if name not in data})
  return data


def task_config(name: str) -> ml_collections.ConfigDict:
  """The fields the task's reader and data command read, at the record's defaults: ``task``,
  ``seed`` (0), ``data`` (:func:`data_section`) and ``model.max_length`` (the record's).
  ``python -m simpletron_jax.data`` uses it without ``--config``; the run configs
  (``configs/lra.py``) have the same fields and more.

  Raises:
    ValueError: for an unknown task (:func:`get`).
  """
  spec = get(name)
  config = ml_collections.ConfigDict()
  config.task = spec.name
  config.seed = 0
  config.data = data_section(spec, config.get_ref("seed"))
  config.model = ml_collections.ConfigDict()
  config.model.max_length = spec.max_length
  return config


_KINDS = {bool: "True or False", int: "an int", float: "a number", str: "a string",
          tuple: "a tuple"}


def _kind(default: Any) -> type:
  """The type of a ``data_options`` default (a type: itself, its field may be None)."""
  return default if isinstance(default, type) else type(default)


def _typed(field: str, value: Any, default: Any) -> Any:
  """``value`` of config field ``field`` as the type of ``default`` (None where ``default`` is
  a type); raises ValueError naming the field otherwise."""
  kind = _kind(default)
  if value is None and isinstance(default, type):
    return None
  flag = isinstance(value, (bool, np.bool_))
  if ((kind is bool and flag) or (kind is int and isinstance(value, (int, np.integer))
                                  and not flag)
      or (kind is float and isinstance(value, (int, float, np.integer, np.floating))
          and not flag) or (kind is str and isinstance(value, str))
      or (kind is tuple and isinstance(value, (tuple, list)))):
    return kind(value)
  raise ValueError(f"{field}={value!r} must be {_KINDS.get(kind, kind.__name__)}")


def data_config(config: ml_collections.ConfigDict) -> DataConfig:
  """The typed data settings of ``config`` (``task``, ``model.max_length``, ``data``): the
  record's :attr:`TaskSpec.settings`, at its defaults where ``config.data`` lacks a field.

  Raises:
    ValueError: one line naming the field: an unknown ``task``, a ``data`` field the task
      does not have, or a value of another type than its default's.
  """
  spec = get(config.task)
  unknown = sorted(set(config.data) - set(spec.options) - {"seed"})
  if unknown:
    raise ValueError(f"data.{unknown[0]} is not a data setting of task {spec.name!r}; its "
                     f"settings: seed, {', '.join(spec.options)}")
  values = {name: _typed(f"data.{name}", config.data[name], default)
            for name, default in spec.options.items() if name in config.data}
  return spec.settings(task=spec.name, max_length=_typed("model.max_length",
                                                         config.model.max_length, 0),
                       seed=_typed("data.seed", config.data.seed, 0), **values)


def load_task(data: DataConfig) -> TaskData:
  """Loads (generating first where the task allows) the data of ``data.task``, with the reader
  of its record; each task module's docstring gives its sources and their order,
  ``python -m simpletron_jax.data where`` where each task reads from, docs/data.md where to
  put the data.

  Raises:
    ValueError: a malformed data file (with file:line), or a bad option value (naming its
      ``data.*`` field).
    FileNotFoundError: when the data is missing; the message names ``data.data_dir``.
  """
  return get(data.task).reader(data)


# ----------------------------------------------------------------------------
# What the readers share: the source folders, LRA's pixel mask.


def default_tfds_data_dir() -> str:
  """tfds's default data dir: ``$TFDS_DATA_DIR``, else ``~/tensorflow_datasets`` (expanded)."""
  return os.path.expanduser(os.environ.get("TFDS_DATA_DIR") or DEFAULT_TFDS_DATA_DIR)


def source_dirs(data: DataConfig, tfds_name: str) -> tuple[str | None, str | None]:
  """The ``(data_dir, tfds_data_dir)`` the text, image and agnews loaders search, in order.

  ``data.tfds_data_dir`` when set (then ``data.data_dir``); else ``data.data_dir`` when set
  (no tfds); else tfds's default data dir (:func:`default_tfds_data_dir`) when it holds a
  prepared ``tfds_name``, then the loader's own default folders. So a user's tfds copy in
  the place tfds puts it is found without a flag, and an explicit ``data.data_dir`` always
  wins over it.

  Args:
    data: the task's settings (``data_dir``, ``tfds_data_dir``).
    tfds_name: the tfds data set (``imdb_reviews/plain_text``, ``cifar10``,
      ``ag_news_subset``).

  Returns:
    Both folders expanded, or None.
  """
  data_dir, tfds_dir = data.folder("data_dir"), data.folder("tfds_data_dir")
  if tfds_dir is None and data_dir is None:
    default = default_tfds_data_dir()
    if find_prepared_tfds(default, tfds_name) is not None:
      tfds_dir = default
  return data_dir, tfds_dir


def describe(kind: str, where: Any) -> str:
  """``<kind>: <path>[, <path>]`` of a reader's ``find_source`` result, for the logs."""
  paths = where.values() if isinstance(where, dict) else [where]
  return f"{kind}: {', '.join(str(p) for p in paths)}"


def found_source(task: str, kind: str, found: Any) -> Where:
  """The :class:`Where` of a reader's ``find_source`` result (for one file per split, in one
  folder, the folder)."""
  if isinstance(found, dict):
    found = os.path.dirname(next(iter(found.values())))
  return Where(task, kind, found, True)


def apply_lra_pixel_mask(data: DataConfig,
                         splits: dict[str, RaggedExamples]) -> dict[str, RaggedExamples]:
  """With ``data.lra_pixel_mask``, drops the explicit all-real mask.

  LRA's image and Pathfinder models mask ``token > 0`` (docs/lra_parity.md), so black
  pixels (value 0) are treated as padding; True reproduces that, False keeps every pixel
  real. Applies to the ``image``, ``pathfinder`` and ``pathx`` loaders.

  Args:
    data: the task's settings; reads ``lra_pixel_mask``.
    splits: split name -> examples with ``explicit_mask=True``.

  Returns:
    ``splits``, with ``explicit_mask=False`` when the option is on.
  """
  if not data.lra_pixel_mask:
    return splits
  return {name: dataclasses.replace(split, explicit_mask=False)
          for name, split in splits.items()}
