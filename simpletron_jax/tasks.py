"""Task registry: turns ``config.task`` and ``config.data`` into splits and sizes."""

from __future__ import annotations

import dataclasses
import os

import ml_collections
import numpy as np

from simpletron_jax.data.common import PairedExamples, RaggedExamples

DEFAULT_CACHE = os.path.join("~", ".cache", "simpletron_jax")
DEFAULT_TFDS_DATA_DIR = os.path.join("~", "tensorflow_datasets")
"""tfds's own default data dir, used when ``$TFDS_DATA_DIR`` is unset."""
DEFAULT_DATA_ROOT = os.path.join("~", "data")
"""Where ``python -m simpletron_jax.data prepare`` writes by default (``--dest``): the loaders
search ``~/data/imdb``, ``~/data/cifar10``, ``~/data/lra_release`` (AAN) and
``~/data/ag_news_csv`` when ``data.data_dir`` is unset."""
DEFAULT_LRA_DIR = os.path.join(DEFAULT_DATA_ROOT, "lra_release")
DEFAULT_AGNEWS_DIR = os.path.join(DEFAULT_DATA_ROOT, "ag_news_csv")


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


def cache_dir(config: ml_collections.ConfigDict) -> str:
  """The data cache: ``config.data.cache_dir``, else ``$SIMPLETRON_JAX_CACHE``,
  else ``~/.cache/simpletron_jax``."""
  path = config.data.get("cache_dir") or os.environ.get("SIMPLETRON_JAX_CACHE") or DEFAULT_CACHE
  return os.path.expanduser(path)


def default_tfds_data_dir() -> str:
  """tfds's default data dir: ``$TFDS_DATA_DIR``, else ``~/tensorflow_datasets`` (expanded)."""
  return os.path.expanduser(os.environ.get("TFDS_DATA_DIR") or DEFAULT_TFDS_DATA_DIR)


def source_dirs(config: ml_collections.ConfigDict, tfds_name: str
                ) -> tuple[str | None, str | None]:
  """The ``(data_dir, tfds_data_dir)`` the text, image and agnews loaders search, in order.

  ``data.tfds_data_dir`` when set (then ``data.data_dir``); else ``data.data_dir`` when set
  (no tfds); else tfds's default data dir (:func:`default_tfds_data_dir`) when it holds a
  prepared ``tfds_name``, then the loader's own default folders. So a user's tfds copy in
  the place tfds puts it is found without a flag, and an explicit ``data.data_dir`` always
  wins over it.

  Args:
    config: the run config (``data.data_dir``, ``data.tfds_data_dir``).
    tfds_name: the tfds data set (``imdb_reviews/plain_text``, ``cifar10``,
      ``ag_news_subset``).

  Returns:
    Both folders expanded, or None.
  """
  from simpletron_jax.data import tfds_io  # pylint: disable=import-outside-toplevel
  data_dir, tfds_dir = _optional_dir(config, "data_dir"), _optional_dir(config, "tfds_data_dir")
  if tfds_dir is None and data_dir is None:
    default = default_tfds_data_dir()
    if tfds_io.find_prepared_tfds(default, tfds_name) is not None:
      tfds_dir = default
  return data_dir, tfds_dir


def listops_generator_args(config: ml_collections.ConfigDict) -> dict:
  """The :func:`simpletron_jax.data.listops.ensure_generated` arguments of ``config.data``
  (``cache_dir`` included): the data the listops task generates when ``data.data_dir`` is
  unset."""
  data = config.data
  return dict(cache_dir=os.path.join(cache_dir(config), "listops"), seed=int(data.seed),
              num_train=data.num_train, num_val=data.num_val, num_test=data.num_test,
              min_length=data.min_tokens, max_length=data.max_tokens,
              max_depth=data.max_depth, max_args=data.max_args)


def pathfinder_generator_args(config: ml_collections.ConfigDict) -> dict:
  """The :func:`simpletron_jax.data.pathfinder.ensure_generated` arguments of ``config.data``
  (``cache_dir`` included): the level the pathfinder and pathx tasks generate when
  ``data.data_dir`` is unset."""
  data = config.data
  return dict(cache_dir=os.path.join(cache_dir(config), "pathfinder"), seed=int(data.seed),
              resolution=int(data.resolution), level=data.level,
              num_images=int(data.num_images), generator=str(data.get("generator", "dashed")))


def retrieval_data_dir(config: ml_collections.ConfigDict) -> str | None:
  """The folder the retrieval task searches for the AAN TSVs: ``data.data_dir``, else
  :data:`DEFAULT_LRA_DIR` when it holds them (``python -m simpletron_jax.data prepare --task
  retrieval`` puts them there), else None."""
  from simpletron_jax.data import retrieval  # pylint: disable=import-outside-toplevel
  data_dir = _optional_dir(config, "data_dir")
  if data_dir:
    return data_dir
  try:
    retrieval.find_data_dir(DEFAULT_LRA_DIR)
  except FileNotFoundError:
    return None
  return os.path.expanduser(DEFAULT_LRA_DIR)


def agnews_source_dirs(config: ml_collections.ConfigDict) -> tuple[str | None, str | None]:
  """As :func:`source_dirs` for ``ag_news_subset``, with :data:`DEFAULT_AGNEWS_DIR` as the
  default CSV folder when it holds ``train.csv`` and ``test.csv``."""
  from simpletron_jax.data import agnews  # pylint: disable=import-outside-toplevel
  data_dir, tfds_dir = source_dirs(config, agnews.TFDS_NAME)
  default = os.path.expanduser(DEFAULT_AGNEWS_DIR)
  if data_dir is None and tfds_dir is None and all(
      os.path.isfile(os.path.join(default, name)) for name in agnews.CSV_FILES.values()):
    data_dir = default
  return data_dir, tfds_dir


def _load_listops(config: ml_collections.ConfigDict) -> TaskData:
  from simpletron_jax.data import listops  # pylint: disable=import-outside-toplevel
  data = config.data
  data_dir = data.get("data_dir")
  if not data_dir:
    data_dir = listops.ensure_generated(**listops_generator_args(config))
  data_dir = os.path.expanduser(data_dir)
  splits = {s: listops.load_split(data_dir, s, task=data.get("task_name", "basic"))
            for s in ("train", "val", "test")}
  return TaskData(**splits, vocab_size=listops.VOCAB_SIZE, num_classes=listops.NUM_CLASSES,
                  source=data_dir)


def _optional_dir(config: ml_collections.ConfigDict, field: str) -> str | None:
  path = config.data.get(field)
  return os.path.expanduser(path) if path else None


def _describe(kind: str, where) -> str:
  paths = where.values() if isinstance(where, dict) else [where]
  return f"{kind}: {', '.join(str(p) for p in paths)}"


def _load_text(config: ml_collections.ConfigDict) -> TaskData:
  from simpletron_jax.data import text  # pylint: disable=import-outside-toplevel
  data_dir, tfds_dir = source_dirs(config, text.TFDS_NAME)
  kind, where = text.find_source(data_dir, tfds_dir)
  splits = text.load_text(data_dir=data_dir, tfds_data_dir=tfds_dir,
                          max_length=int(config.model.max_length), seed=int(config.data.seed),
                          val_fraction=float(config.data.get("val_fraction", 0.1)))
  return TaskData(**splits, vocab_size=text.VOCAB_SIZE, num_classes=text.NUM_CLASSES,
                  source=_describe(kind, where))


def apply_lra_pixel_mask(config: ml_collections.ConfigDict,
                         splits: dict[str, RaggedExamples]) -> dict[str, RaggedExamples]:
  """With ``config.data.lra_pixel_mask`` (default False), drops the explicit all-real mask.

  LRA's image and Pathfinder models mask ``token > 0`` (docs/lra_parity.md), so black
  pixels (value 0) are treated as padding; True reproduces that, False keeps every pixel
  real. Applies to the ``image``, ``pathfinder`` and ``pathx`` loaders.

  Args:
    config: the run config; reads ``data.lra_pixel_mask``.
    splits: split name -> examples with ``explicit_mask=True``.

  Returns:
    ``splits``, with ``explicit_mask=False`` when the option is on.
  """
  if not config.data.get("lra_pixel_mask", False):
    return splits
  return {name: dataclasses.replace(split, explicit_mask=False)
          for name, split in splits.items()}


def _flag(config: ml_collections.ConfigDict, field: str) -> bool:
  """``config.data.<field>`` as a bool (False when absent).

  Raises:
    ValueError: naming ``data.<field>`` when the value is not a bool.
  """
  value = config.data.get(field, False)
  if not isinstance(value, (bool, np.bool_)):
    raise ValueError(f"data.{field} must be True or False, got {value!r}")
  return bool(value)


def _load_image(config: ml_collections.ConfigDict) -> TaskData:
  from simpletron_jax.data import image  # pylint: disable=import-outside-toplevel
  data_dir, tfds_dir = source_dirs(config, image.TFDS_NAME)
  kind, where = image.find_source(data_dir, tfds_dir)
  splits = image.load_image(data_dir=data_dir, tfds_data_dir=tfds_dir,
                            seed=int(config.data.seed),
                            val_fraction=float(config.data.val_fraction),
                            lra_split=_flag(config, "lra_split"))
  splits = apply_lra_pixel_mask(config, splits)
  return TaskData(**splits, vocab_size=image.VOCAB_SIZE, num_classes=image.NUM_CLASSES,
                  source=_describe(kind, where))


def _load_retrieval(config: ml_collections.ConfigDict) -> TaskData:
  from simpletron_jax.data import retrieval  # pylint: disable=import-outside-toplevel
  data_dir = retrieval_data_dir(config)
  if not data_dir:
    raise FileNotFoundError(
        "config field data.data_dir is unset and ~/data/lra_release holds no AAN files: the "
        "retrieval task needs LRA's new_aan_pairs.{train,eval,test}.tsv (inside lra_release.gz, "
        "https://storage.googleapis.com/long-range-arena/lra_release.gz); run python -m "
        "simpletron_jax.data prepare --task retrieval --from lra_release.gz, or pass "
        "--config.data.data_dir=/path/to/tsv_data")
  pairs = retrieval.load_retrieval(data_dir=data_dir, max_length=int(config.model.max_length),
                                   unescape=bool(config.data.get("unescape", False)))
  splits = {name: PairedExamples(*pairs[name]) for name in ("train", "val", "test")}
  return TaskData(**splits, vocab_size=retrieval.VOCAB_SIZE,
                  num_classes=retrieval.NUM_CLASSES, source=data_dir)


def _load_pathfinder(config: ml_collections.ConfigDict) -> TaskData:
  from simpletron_jax.data import pathfinder  # pylint: disable=import-outside-toplevel
  data = config.data
  data_dir = data.get("data_dir")
  if not data_dir:
    data_dir = pathfinder.ensure_generated(**pathfinder_generator_args(config))
  data_dir = os.path.expanduser(data_dir)
  splits = pathfinder.load_pathfinder(data_dir, resolution=int(data.resolution),
                                      level=data.level, seed=int(data.seed),
                                      split_fractions=tuple(data.split_fractions),
                                      split_hash=str(data.get("split_hash", "blake2b")))
  splits = apply_lra_pixel_mask(config, splits)
  return TaskData(**splits, vocab_size=pathfinder.VOCAB_SIZE,
                  num_classes=pathfinder.NUM_CLASSES, source=data_dir)


def _load_agnews(config: ml_collections.ConfigDict) -> TaskData:
  from simpletron_jax.data import agnews  # pylint: disable=import-outside-toplevel
  data_dir, tfds_dir = agnews_source_dirs(config)
  kind, where = agnews.find_source(data_dir, tfds_dir)
  splits, tokenizer, _ = agnews.load_agnews(
      data_dir=data_dir, tfds_data_dir=tfds_dir, vocab_path=config.data.get("vocab_path"),
      max_length=int(config.model.max_length), seed=int(config.data.seed),
      val_fraction=float(config.data.get("val_fraction", 0.05)),
      lowercase=config.data.get("lowercase"))
  return TaskData(**splits, vocab_size=tokenizer.vocab_size, num_classes=agnews.NUM_CLASSES,
                  source=f"{_describe(kind, where)}; vocabulary {tokenizer.path}")


_LOADERS = {"listops": _load_listops, "text": _load_text, "retrieval": _load_retrieval,
            "image": _load_image, "pathfinder": _load_pathfinder, "pathx": _load_pathfinder,
            "agnews": _load_agnews}


def load_task(config: ml_collections.ConfigDict) -> TaskData:
  """Loads (generating first where the task allows) the data named by ``config.task``.

  Tasks (``config.task``): ``listops`` (generated when ``data.data_dir`` is unset),
  ``text`` (tfds ``imdb_reviews`` in ``data.tfds_data_dir``, else the JSONL or ``aclImdb``
  files in ``data.data_dir``, else a prepared copy in tfds's default data dir, else
  ``../shared/data/imdb`` or ``~/data/imdb``; :func:`source_dirs`), ``retrieval`` (LRA's AAN
  TSVs in ``data.data_dir``, else in ``~/data/lra_release``), ``image`` (tfds ``cifar10``,
  else the npz in ``data.data_dir``, else tfds's default data dir, else
  ``../shared/data/cifar10`` or ``~/data/cifar10``), ``pathfinder`` and ``pathx`` (LRA's
  layout in ``data.data_dir``, else generated into the cache), ``agnews`` (SimpleTRON section
  5.3: tfds ``ag_news_subset`` in ``data.tfds_data_dir``, else the CSV release in
  ``data.data_dir``, else tfds's default data dir, else ``~/data/ag_news_csv``, tokenized with
  the BERT vocabulary of ``data.vocab_path``; :mod:`simpletron_jax.data.agnews`).
  ``python -m simpletron_jax.data where`` prints where each task reads from.

  LRA's data as options (defaults off): ``data.lra_split`` (image: LRA's
  ``train[:90%]``/``train[90%:]``, see :func:`simpletron_jax.data.image.load_image`) and
  ``data.split_hash="lra"`` (pathfinder, pathx: LRA's tfds members, see
  :func:`simpletron_jax.data.pathfinder.load_pathfinder`).

  Raises:
    ValueError: for an unknown ``config.task``, a malformed data file (with file:line), or a
      bad option value (naming its ``data.*`` field).
    FileNotFoundError: when the data is missing; the message names ``data.data_dir``.
  """
  try:
    loader = _LOADERS[config.task]
  except KeyError:
    raise ValueError(f"unknown task {config.task!r} (config field task); known: "
                     f"{sorted(_LOADERS)}") from None
  return loader(config)
