"""The task registry: one record per task (:class:`TaskSpec`) and its reader.

A record holds everything the project knows about a task: its reader (``config ->``
:class:`TaskData`), vocabulary and classes, ``max_length``, the published model and recipe,
its ``:tiny`` sizes and other ``:variant`` suffixes, LRA's per-baseline settings, the
SimpleTRON and self-pretraining recipes and the published accuracies. ``configs/lra.py``
builds every config from it; :func:`load_task`, :mod:`simpletron_jax.tools.tpu_aot`,
:mod:`simpletron_jax.train.pretraining`, :mod:`simpletron_jax.tools.published` and
:mod:`simpletron_jax.train.config_checks` read it. ``get(name)`` returns a record, ``names()`` the
tasks; docs/tasks.md says how to add one.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Mapping

import ml_collections
import numpy as np

from simpletron_jax.data import agnews, image, listops, pathfinder, retrieval, text
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
  data_dir, tfds_dir = source_dirs(config, agnews.TFDS_NAME)
  default = os.path.expanduser(DEFAULT_AGNEWS_DIR)
  if data_dir is None and tfds_dir is None and all(
      os.path.isfile(os.path.join(default, name)) for name in agnews.CSV_FILES.values()):
    data_dir = default
  return data_dir, tfds_dir


def _load_listops(config: ml_collections.ConfigDict) -> TaskData:
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
  data_dir, tfds_dir = agnews_source_dirs(config)
  kind, where = agnews.find_source(data_dir, tfds_dir)
  splits, tokenizer, _ = agnews.load_agnews(
      data_dir=data_dir, tfds_data_dir=tfds_dir, vocab_path=config.data.get("vocab_path"),
      max_length=int(config.model.max_length), seed=int(config.data.seed),
      val_fraction=float(config.data.get("val_fraction", 0.05)),
      lowercase=config.data.get("lowercase"))
  return TaskData(**splits, vocab_size=tokenizer.vocab_size, num_classes=agnews.NUM_CLASSES,
                  source=f"{_describe(kind, where)}; vocabulary {tokenizer.path}")


# ----------------------------------------------------------------------------
# The task records. Each number is written once, here; configs/lra.py builds the configs from
# them, and tpu_aot, pretraining, published and config_checks read them (docs/tasks.md).


@dataclasses.dataclass(frozen=True)
class ModelSize:
  """An encoder's sizes, in the field's names (those of ``config.model``).

  Attributes:
    emb_dim: the width of the token states (features).
    num_heads: attention heads per block.
    qkv_dim: the width of the queries, keys and values over all heads (features).
    mlp_dim: the hidden width of each block's MLP (features).
    num_layers: encoder blocks.
  """

  emb_dim: int
  num_heads: int
  qkv_dim: int
  mlp_dim: int
  num_layers: int


@dataclasses.dataclass(frozen=True)
class Recipe:
  """The optimisation of a task's published configs; the defaults are LRA's ListOps ones
  (``lra_benchmarks/listops/configs/base_listops_config.py``), which most tasks keep.

  Attributes:
    batch_size: examples per optimizer step (global).
    learning_rate: the peak rate of the schedule.
    factors: the schedule (:mod:`simpletron_jax.train.schedules`).
    warmup: linear-warmup steps (optimizer steps).
    num_train_steps: optimizer steps.
    eval_frequency: steps between validations.
    checkpoint_every: steps between checkpoints.
    weight_decay: AdamW's decoupled decay.
    grad_clip_norm: global-norm clipping; 0: none.
    adam_b1, adam_b2, adam_eps: Adam's constants.
  """

  batch_size: int = 32
  learning_rate: float = 0.05
  factors: str = "constant * linear_warmup * rsqrt_decay"
  warmup: int = 1000
  num_train_steps: int = 5000
  eval_frequency: int = 50
  checkpoint_every: int = 200
  weight_decay: float = 0.1
  grad_clip_norm: float = 0.0
  adam_b1: float = 0.9
  adam_b2: float = 0.98
  adam_eps: float = 1e-9

  @classmethod
  def by_epochs(cls, batch_size: int, train_examples: int, epochs: int,
                learning_rate: float, **fields) -> "Recipe":
    """LRA's image recipe (``lra_benchmarks/image/train.py``): cosine decay over ``epochs``
    epochs of ``train_examples // batch_size`` steps after a one-epoch warmup, validation and
    a checkpoint once an epoch, no weight decay; ``fields`` override the rest."""
    steps_per_epoch = train_examples // batch_size
    return cls(batch_size=batch_size, learning_rate=learning_rate,
               factors="constant * linear_warmup * cosine_decay", warmup=steps_per_epoch,
               num_train_steps=steps_per_epoch * epochs, eval_frequency=steps_per_epoch,
               checkpoint_every=steps_per_epoch, weight_decay=0.0, **fields)


@dataclasses.dataclass(frozen=True)
class Variant:
  """A task's own ``:variant`` of its configs (a CPU size such as ``:tiny``); unset fields
  (None, empty) keep the published config's values.

  Attributes:
    model: encoder sizes to change, by :class:`ModelSize` field name (a partial size keeps the
      attention's own sizes for the rest, as LRA's per-baseline image sizes).
    max_length: ``model.max_length`` (tokens, CLS excluded).
    batch_size, learning_rate: as :class:`Recipe`.
    num_train_steps, warmup: as :class:`Recipe` (optimizer steps).
    eval_frequency: steps between validations, and between checkpoints.
    num_eval_steps, num_test_steps: batches per validation and of the final test; -1: the
      whole split.
    options: any other config fields, by dotted name (``"data.num_images"``).
  """

  model: Mapping[str, int] = dataclasses.field(default_factory=dict)
  max_length: int | None = None
  batch_size: int | None = None
  learning_rate: float | None = None
  num_train_steps: int | None = None
  warmup: int | None = None
  eval_frequency: int | None = None
  num_eval_steps: int | None = None
  num_test_steps: int | None = None
  options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class LraBaseline:
  """One LRA baseline's own settings on a task (``lra_benchmarks/<task>/configs/
  <model_type>_base.py`` and the model files' defaults that ran), over the task's record.

  Attributes:
    model: ``config.model`` fields (sizes by :class:`ModelSize` names, dropout, pooling).
    attention_kwargs: ``config.model.attention_kwargs`` entries.
    options: other config fields by dotted name (``"weight_decay"``).
  """

  model: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  attention_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class SptRecipe:
  """One stage of Amos et al.'s self-pretraining recipe (``configs/experiment/lra/
  transformer-lra-<task>[-mlm].yaml`` of github.com/IdoAmos/not-from-scratch at f919137).

  Attributes:
    learning_rate: the constant rate after the warmup.
    weight_decay: AdamW's decoupled decay.
    warmup: linear-warmup steps.
    batch_size: examples per step.
    epochs: passes over :attr:`TaskSpec.train_examples`.
  """

  learning_rate: float
  weight_decay: float
  warmup: int
  batch_size: int
  epochs: int


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """Everything the project knows about one task; ``configs/lra.py``, :func:`load_task`,
  ``tpu_aot``, ``pretraining``, ``published`` and ``config_checks`` read it (docs/tasks.md).

  Attributes:
    name: the registry key, ``config.task`` and the folder ``configs/<name>/``.
    reader: ``config -> TaskData``: loads (or generates) the three splits.
    vocab_size: token ids lie in ``[0, vocab_size)``, 0 padding; None when the reader's
      tokenizer decides it (``agnews``: the BERT vocabulary of ``data.vocab_path``).
    num_classes: labels.
    max_length: the published ``model.max_length`` (tokens per document, CLS excluded).
    model: the published encoder (LRA's Transformer; BERT-base for ``agnews``).
    recipe: the published optimisation.
    source: where ``max_length``, ``model``, ``recipe`` and the options come from.
    dual: two documents per example (retrieval's dual encoder).
    lra: one of LRA's six tasks (Tay et al., ICLR 2021); they are registered in the order of
      LRA's Table 1, which :func:`lra_tasks` keeps.
    train_examples: training examples per epoch as the epoch-based recipes count them
      (:meth:`Recipe.by_epochs`, :class:`SptRecipe`); None where no recipe counts epochs.
    model_options: other ``config.model`` fields of the published config (dropout, pooling,
      positions, the BERT encoder's structure).
    data_options: the reader's ``config.data`` fields with their defaults; a type (``str``,
      ``bool``) makes an unset field (None) of that type.
    variants: the task's own ``:variant`` suffixes (``tiny``, ...) by name, in order.
    lra_baselines: per LRA ``model_type`` (``AttentionSpec.lra_model_type``), the baseline's
      own settings on this task.
    lra_baseline_max_length: ``model.max_length`` in LRA's code for every attention but
      SimpleTRON's (text: 1000); None: ``max_length``.
    lra_code: config fields (dotted) that the ``:lra_code`` variant sets on this task beyond
      the shared ones (``configs/lra.apply_lra_code``).
    simpletron: the SimpleTRON paper's appendix A settings for ``simple*`` (dotted config
      fields; the shared AdamW and learned positions are added by ``configs/lra.py``); None
      where the paper has none, which also leaves out the ``:authors`` variants.
    pretraining: the self-pretraining recipe by stage, ``"spt"`` and ``"ft"``; empty where
      there is none, which leaves out the ``:spt`` variants.
    published: the published test accuracy (%) by attention name, None for FAIL;
      :mod:`simpletron_jax.tools.published` gives each row's source and protocol.
  """

  name: str
  reader: Callable[[ml_collections.ConfigDict], TaskData]
  vocab_size: int | None
  num_classes: int
  max_length: int
  model: ModelSize
  recipe: Recipe
  source: str
  dual: bool = False
  lra: bool = True
  train_examples: int | None = None
  model_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  data_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  variants: Mapping[str, Variant] = dataclasses.field(default_factory=dict)
  lra_baselines: Mapping[str, LraBaseline] = dataclasses.field(default_factory=dict)
  lra_baseline_max_length: int | None = None
  lra_code: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  simpletron: Mapping[str, Any] | None = None
  pretraining: Mapping[str, SptRecipe] = dataclasses.field(default_factory=dict)
  published: Mapping[str, float | None] = dataclasses.field(default_factory=dict)


REGISTRY: dict[str, TaskSpec] = {}


def register(spec: TaskSpec) -> TaskSpec:
  """Adds ``spec`` under ``spec.name``.

  Raises:
    ValueError: if the name is taken.
  """
  if spec.name in REGISTRY:
    raise ValueError(f"task {spec.name!r} is already registered")
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


def load_task(config: ml_collections.ConfigDict) -> TaskData:
  """Loads (generating first where the task allows) the data named by ``config.task``, with
  the reader of its record.

  Tasks (``config.task``): ``listops`` (generated when ``data.data_dir`` is unset),
  ``text`` (tfds ``imdb_reviews`` in ``data.tfds_data_dir``, else the JSONL or ``aclImdb``
  files in ``data.data_dir``, else a prepared copy in tfds's default data dir, else
  ``~/data/imdb``; :func:`source_dirs`), ``retrieval`` (LRA's AAN TSVs in ``data.data_dir``,
  else in ``~/data/lra_release``), ``image`` (tfds ``cifar10``, else the npz in
  ``data.data_dir``, else tfds's default data dir, else ``~/data/cifar10``), ``pathfinder``
  and ``pathx`` (LRA's layout in ``data.data_dir``, else generated into the cache),
  ``agnews`` (SimpleTRON section 5.3: tfds ``ag_news_subset`` in ``data.tfds_data_dir``, else
  the CSV release in ``data.data_dir``, else tfds's default data dir, else
  ``~/data/ag_news_csv``, tokenized with the BERT vocabulary of ``data.vocab_path``;
  :mod:`simpletron_jax.data.agnews`). ``python -m simpletron_jax.data where`` prints where
  each task reads from; docs/data.md says where to put the data.

  LRA's data as options (defaults off): ``data.lra_split`` (image: LRA's
  ``train[:90%]``/``train[90%:]``, see :func:`simpletron_jax.data.image.load_image`) and
  ``data.split_hash="lra"`` (pathfinder, pathx: LRA's tfds members, see
  :func:`simpletron_jax.data.pathfinder.load_pathfinder`).

  Raises:
    ValueError: for an unknown ``config.task`` (naming the field and the known tasks), a
      malformed data file (with file:line), or a bad option value (naming its ``data.*``
      field).
    FileNotFoundError: when the data is missing; the message names ``data.data_dir``.
  """
  return get(config.task).reader(config)


# The CPU size of the Nystromformer LRA setup (Xiong et al., 2021): 2 layers, emb 64, 2 heads,
# qkv 64, mlp 128.
_TINY_MODEL = {"emb_dim": 64, "num_heads": 2, "qkv_dim": 64, "mlp_dim": 128, "num_layers": 2}

# LRA's Table 1 (Tay et al., ICLR 2021), by attention name; docs/reporting.md.
_LRA_TABLE1 = ("softmax", "local", "sparse", "longformer", "linformer", "reformer", "sinkhorn",
               "synthesizer", "bigbird", "linear", "performer")


def _published(lra: tuple[float | None, ...], simpletron: tuple[float, ...] = ()
               ) -> dict[str, float | None]:
  """A task's published accuracies (%): LRA's Table 1 column in :data:`_LRA_TABLE1` order, then
  the SimpleTRON results table's Simple, Simple-Res and Simple-ResL."""
  cells = dict(zip(_LRA_TABLE1, lra, strict=True))
  cells.update(zip(("simple", "simple_res", "simple_resl"), simpletron))
  return cells


def _pathfinder_data(resolution: int) -> dict[str, Any]:
  """The Pathfinder reader's ``config.data`` fields at ``resolution`` pixels per side."""
  return {
      "bucket": 0,                  # every image is a full sequence
      "resolution": resolution,     # pixels per side
      "level": "hard",              # easy | intermediate | hard (contour length 6 / 9 / 14)
      "num_images": 200000,         # images to generate when data_dir is unset
      # dashed: LRA's images (the algorithm of drewlinsley/pathfinder, contours of separate
      # paddles) | solid: connected paths, whose label a connected-component labelling reads
      "generator": "dashed",
      "split_fractions": (0.8, 0.1, 0.1),
      "lra_pixel_mask": False,      # True: LRA's mask token > 0 (black pixels are padding)
      "split_hash": "blake2b",      # blake2b (seeded) | lra: LRA's tfds members (MD5 of keys)
      "drop_last_eval_batch": False,  # True: LRA drops the last partial val/test batch
  }


_TEXT_TINY = Variant(model=_TINY_MODEL, learning_rate=0.05, max_length=512,
                     num_train_steps=500, warmup=100, eval_frequency=250, num_eval_steps=16,
                     num_test_steps=128)
_LISTOPS_TINY_LRA = Variant(model=_TINY_MODEL, learning_rate=0.05, num_train_steps=5000,
                            warmup=1000, eval_frequency=200, num_eval_steps=-1,
                            num_test_steps=-1)
_AGNEWS_TINY = Variant(model=_TINY_MODEL, max_length=64, batch_size=32, learning_rate=1e-3,
                       num_train_steps=500, warmup=50, eval_frequency=250, num_eval_steps=16,
                       num_test_steps=-1, options={"model.max_positions": 64})
AGNEWS_FROM_BERT = ("set --config.init_from to the folder written by python -m "
                    "simpletron_jax.tools.bert_import BERT_DIR OUT_DIR (docs/bert.md)")
"""``init_from`` of the ``agnews`` ``:from_bert`` variants until the user sets it: a run stops
on it, naming what to do."""

register(TaskSpec(
    name="listops", reader=_load_listops, vocab_size=listops.VOCAB_SIZE,
    num_classes=listops.NUM_CLASSES, max_length=2000,
    model=ModelSize(emb_dim=512, num_heads=8, qkv_dim=512, mlp_dim=1024, num_layers=4),
    recipe=Recipe(),
    source="LRA listops/configs/base_listops_config.py: batch 32, lr 0.05 rsqrt, warmup "
           "1000, 5000 steps, 4 x 512 model, max_length 2000; data from the seeded generator",
    train_examples=96000,
    data_options={"task_name": "basic",  # files are {task_name}_{train,val,test}.tsv
                  "num_train": 96000, "num_val": 2000, "num_test": 2000,
                  # the generator keeps min_tokens < length < max_tokens
                  "min_tokens": 500, "max_tokens": 2000, "max_depth": 10, "max_args": 10},
    variants={
        # 20 < tokens < 200: the range of the original ListOps (Nangia & Bowman, 2018).
        "tiny": dataclasses.replace(_LISTOPS_TINY_LRA, max_length=200, options={
            "data.min_tokens": 20, "data.max_tokens": 200, "data.bucket": 32}),
        "tiny_lra": _LISTOPS_TINY_LRA},
    # listops/configs/performer_base.py: FAVOR+ softmax with 2 features, redrawn every call.
    lra_baselines={"performer": LraBaseline(attention_kwargs={
        "kernel": "softmax", "num_features": 2, "redraw": True, "lra_masking": False})},
    simpletron={"learning_rate": 0.005, "num_train_steps": 15000, "model.num_layers": 6,
                "model.mlp_dim": 2048},
    pretraining={"spt": SptRecipe(0.05, 0.0, 2000, 32, 100),
                 "ft": SptRecipe(0.05, 0.0, 2000, 32, 100)},
    published=_published((36.37, 15.82, 17.07, 35.63, 35.70, 37.27, 33.67, 36.99, 36.05,
                          16.13, 18.01), (37.45, 37.10, 37.55)),
))

register(TaskSpec(
    name="text", reader=_load_text, vocab_size=text.VOCAB_SIZE, num_classes=text.NUM_CLASSES,
    max_length=4000,
    model=ModelSize(emb_dim=256, num_heads=4, qkv_dim=256, mlp_dim=1024, num_layers=4),
    recipe=Recipe(num_train_steps=20000, warmup=8000, eval_frequency=100,
                  checkpoint_every=500),
    source="LRA text_classification/configs/base_tc_config.py: IMDB bytes, 20000 steps, "
           "warmup 8000, 4 x 256 model, validation every 100 steps; max_length 4000 as in the "
           "LRA paper and SimpleTRON (LRA's code: 1000, lra_baseline_max_length)",
    train_examples=25000,
    data_options={"tfds_data_dir": str,
                  # IMDB has no validation split: hold out a seeded 10% of train, so the
                  # best-validation checkpoint is not chosen on test. 0: LRA's code, which
                  # validates on the test split.
                  "val_fraction": 0.1},
    variants={"tiny": _TEXT_TINY},
    lra_baseline_max_length=1000,
    lra_code={"data.val_fraction": 0.0},
    simpletron={},
    pretraining={"spt": SptRecipe(0.05, 0.1, 5000, 32, 32),
                 "ft": SptRecipe(0.05, 0.1, 2000, 32, 65)},
    published=_published((64.27, 52.98, 63.58, 62.85, 53.94, 56.10, 61.20, 61.68, 64.02,
                          65.90, 65.40), (66.75, 66.65, 66.71)),
))

register(TaskSpec(
    name="retrieval", reader=_load_retrieval, vocab_size=retrieval.VOCAB_SIZE,
    num_classes=retrieval.NUM_CLASSES, max_length=4000,
    model=ModelSize(emb_dim=128, num_heads=4, qkv_dim=128, mlp_dim=512, num_layers=4),
    recipe=Recipe(num_train_steps=5000, warmup=8000, eval_frequency=100,
                  checkpoint_every=500),
    source="LRA matching/configs/base_match_config.py: AAN pairs, 5000 steps, warmup 8000, "
           "4 x 128 model, 4000 bytes per document",
    dual=True,
    data_options={"unescape": False,  # True decodes the b'...' literals of the TSV (not LRA's)
                  "drop_last_eval_batch": False},  # True: LRA drops the last partial batch
    model_options={
        # LRA's code: classifier_head_dual(interaction=None), i.e. [u, v]; "nli" is the LRA
        # paper's [u, v, u * v, u - v].
        "interaction": "concat",
        # True: LRA's TransformerDualEncoder, whose encoders have no CLS token, so "CLS"
        # pooling reads the first real token (a bug; docs/lra_parity.md).
        "lra_dual_no_cls": False},
    variants={"tiny": _TEXT_TINY},
    simpletron={"num_train_steps": 15000},
    published=_published((57.46, 53.39, 59.59, 56.89, 52.27, 53.40, 53.83, 54.67, 59.29,
                          53.09, 53.82), (73.92, 74.83, 73.59)),
))

_CIFAR10_TRAIN = 45000   # CIFAR-10's 50,000 training images less the 10% validation
register(TaskSpec(
    name="image", reader=_load_image, vocab_size=image.VOCAB_SIZE,
    num_classes=image.NUM_CLASSES, max_length=1024,
    model=ModelSize(emb_dim=128, num_heads=8, qkv_dim=64, mlp_dim=128, num_layers=1),
    recipe=Recipe.by_epochs(256, _CIFAR10_TRAIN, 200, 5e-4),
    source="LRA image/configs/cifar10/{base_cifar10_config,transformer_base}.py: CIFAR-10 "
           "grayscale, batch 256, 200 epochs of 45,000 images, lr 5e-4 cosine, 1 x 128 model "
           "with 8 heads, qkv 64, mlp 128, dropout 0.3 / 0.2, CLS pooling, learned positions",
    train_examples=_CIFAR10_TRAIN,
    data_options={
        "bucket": 0,                    # every image is a full sequence
        "tfds_data_dir": str, "val_fraction": 0.1,
        "lra_pixel_mask": False,  # True: LRA's mask token > 0 (black pixels are padding)
        # True: LRA's train[:90%] / train[90%:] in source order (exact with tfds cifar10; with
        # the npz copy LRA's sizes only); False: a seeded 90/10 draw.
        "lra_split": False,
        # True: LRA's batch(drop_remainder=True) on val/test (10,000 test images -> 9,984).
        "drop_last_eval_batch": False},
    model_options={"dropout_rate": 0.3, "attention_dropout_rate": 0.2, "learn_pos_emb": True},
    variants={"tiny": Variant(
        model={"emb_dim": 64, "num_heads": 2, "qkv_dim": 64, "mlp_dim": 128, "num_layers": 1},
        batch_size=32, learning_rate=1e-3, num_train_steps=500, warmup=100,
        eval_frequency=250, num_eval_steps=16, num_test_steps=-1)},
    # image/configs/cifar10/<model_type>_base.py over base_cifar10_config.py (emb 32, 1 head,
    # 1 layer, qkv 32, mlp 64, dropout 0.3, CLS).
    lra_baselines={
        "transformer": LraBaseline({"num_layers": 1, "num_heads": 8, "emb_dim": 128,
                                    "qkv_dim": 64, "mlp_dim": 128}),
        # bigbird_base.py sets ``config.model.num_head = 4``, a misspelt field that LRA's
        # image train.py passes to the model, which raises (TypeError), so LRA's image BigBird
        # never ran from that config; these are its sizes with the misspelt field dropped
        # (1 head).
        "bigbird": LraBaseline({"num_layers": 1, "num_heads": 1, "emb_dim": 128,
                                "qkv_dim": 64, "mlp_dim": 128}, {"block_size": 64}),
        "linear_transformer": LraBaseline({"num_layers": 1, "num_heads": 8, "emb_dim": 128,
                                           "qkv_dim": 64, "mlp_dim": 128}),
        "linformer": LraBaseline({"num_layers": 1, "num_heads": 8, "emb_dim": 128,
                                  "qkv_dim": 64, "mlp_dim": 128}),
        "local": LraBaseline({"num_layers": 1, "num_heads": 2, "emb_dim": 128, "qkv_dim": 64,
                              "mlp_dim": 128, "classifier_pool": "MEAN"}, {"block_size": 64}),
        "longformer": LraBaseline({"num_layers": 4, "num_heads": 4, "emb_dim": 128,
                                   "qkv_dim": 64, "mlp_dim": 128, "classifier_pool": "MEAN"}),
        "performer": LraBaseline({"num_layers": 1, "num_heads": 8, "emb_dim": 128,
                                  "qkv_dim": 64, "mlp_dim": 128}),
        "reformer": LraBaseline({"num_layers": 4, "num_heads": 8, "emb_dim": 64,
                                 "qkv_dim": 32, "mlp_dim": 64}),
        # sinkhorn_base.py keeps the base sizes, sets dropout 0.1 and weight_decay 0.7.
        "sinkhorn": LraBaseline({"num_layers": 1, "num_heads": 1, "emb_dim": 32,
                                 "qkv_dim": 32, "mlp_dim": 64, "dropout_rate": 0.1},
                                {"block_size": 64}, {"weight_decay": 0.7}),
        "sparse_transformer": LraBaseline({"num_layers": 1, "num_heads": 8, "emb_dim": 128,
                                           "qkv_dim": 64, "mlp_dim": 128}),
        "synthesizer": LraBaseline({"num_layers": 1, "num_heads": 8, "emb_dim": 128,
                                    "qkv_dim": 64, "mlp_dim": 128}),
    },
    pretraining={"spt": SptRecipe(1e-3, 0.0, 2500, 32, 50),
                 "ft": SptRecipe(1e-3, 0.0, 2000, 50, 200)},
    published=_published((42.44, 41.46, 44.24, 42.22, 38.56, 38.07, 41.23, 41.61, 40.83,
                          42.34, 42.77)),
))

_PATHFINDER_TRAIN = 160000   # 80% of the 200,000 images of a level
register(TaskSpec(
    name="pathfinder", reader=_load_pathfinder, vocab_size=pathfinder.VOCAB_SIZE,
    num_classes=pathfinder.NUM_CLASSES, max_length=1024,
    model=ModelSize(emb_dim=32, num_heads=4, qkv_dim=16, mlp_dim=32, num_layers=4),
    recipe=Recipe.by_epochs(512, _PATHFINDER_TRAIN, 200, 1e-3),
    source="LRA image/configs/pathfinder32/{base_pathfinder32_config,transformer_base}.py: "
           "batch 512, 200 epochs of 160,000 images, lr 1e-3 cosine, 4 x 32 model with 4 "
           "heads, qkv 16, mlp 32, dropout 0.2 / 0.1, MEAN pooling, sinusoidal positions",
    train_examples=_PATHFINDER_TRAIN,
    data_options=_pathfinder_data(32),
    model_options={"dropout_rate": 0.2, "classifier_pool": "MEAN"},
    # LRA's model cut to 1 layer and 2 heads, so that its softmax has as many L x L scores per
    # example as the image tiny model.
    variants={"tiny": Variant(model={"num_layers": 1, "num_heads": 2}, batch_size=32,
                              num_train_steps=500, warmup=100, eval_frequency=250,
                              num_eval_steps=-1, num_test_steps=-1,
                              options={"data.num_images": 10000})},
    # image/configs/pathfinder32/<model_type>_base.py over base_pathfinder32_config.py (emb
    # 32, 2 heads, 1 layer, qkv 16, mlp 32, dropout 0.1, MEAN, sinusoidal positions).
    lra_baselines={
        "transformer": LraBaseline({"num_layers": 4, "num_heads": 4, "emb_dim": 32,
                                    "qkv_dim": 16, "mlp_dim": 32, "dropout_rate": 0.2}),
        "bigbird": LraBaseline({"num_layers": 4, "num_heads": 2, "emb_dim": 64, "qkv_dim": 32,
                                "mlp_dim": 64, "dropout_rate": 0.2}, {"block_size": 64}),
        "linear_transformer": LraBaseline({"num_layers": 1, "num_heads": 2, "emb_dim": 128,
                                           "qkv_dim": 64, "mlp_dim": 128,
                                           "dropout_rate": 0.2}),
        "linformer": LraBaseline({"num_layers": 1, "num_heads": 2, "emb_dim": 32,
                                  "qkv_dim": 16, "mlp_dim": 32, "dropout_rate": 0.2}),
        "local": LraBaseline({"num_layers": 2, "num_heads": 4, "emb_dim": 64, "qkv_dim": 32,
                              "mlp_dim": 64, "dropout_rate": 0.1}, {"block_size": 64}),
        "longformer": LraBaseline({"num_layers": 2, "num_heads": 2, "emb_dim": 32,
                                   "qkv_dim": 16, "mlp_dim": 32, "dropout_rate": 0.1}),
        "performer": LraBaseline({"num_layers": 4, "num_heads": 8, "emb_dim": 32,
                                  "qkv_dim": 16, "mlp_dim": 32, "dropout_rate": 0.2}),
        "reformer": LraBaseline({"num_layers": 2, "num_heads": 8, "emb_dim": 64,
                                 "qkv_dim": 32, "mlp_dim": 64, "dropout_rate": 0.2}),
        "sinkhorn": LraBaseline({"num_layers": 2, "num_heads": 4, "emb_dim": 32,
                                 "qkv_dim": 16, "mlp_dim": 64, "dropout_rate": 0.2},
                                {"block_size": 64}),
        "sparse_transformer": LraBaseline({"num_layers": 1, "num_heads": 8, "emb_dim": 32,
                                           "qkv_dim": 16, "mlp_dim": 32,
                                           "dropout_rate": 0.2}),
        "synthesizer": LraBaseline({"num_layers": 2, "num_heads": 4, "emb_dim": 64,
                                    "qkv_dim": 32, "mlp_dim": 64, "dropout_rate": 0.2}),
    },
    pretraining={"spt": SptRecipe(5e-4, 0.0, 2500, 32, 50),
                 "ft": SptRecipe(5e-4, 0.0, 5000, 32, 200)},
    published=_published((71.40, 66.63, 71.71, 69.71, 76.34, 68.50, 67.45, 69.45, 74.87,
                          75.30, 77.05)),
))

register(TaskSpec(
    name="pathx", reader=_load_pathfinder, vocab_size=pathfinder.VOCAB_SIZE,
    num_classes=pathfinder.NUM_CLASSES, max_length=16384,
    model=ModelSize(emb_dim=32, num_heads=2, qkv_dim=16, mlp_dim=32, num_layers=1),
    recipe=Recipe.by_epochs(64, _PATHFINDER_TRAIN, 200, 1e-3, grad_clip_norm=1.0),
    source="LRA image/configs/pathfinder128/base_pathfinder128_config.py (Path-X): batch 64, "
           "200 epochs of 160,000 images, lr 1e-3 cosine, gradient clipping 1.0, 1 x 32 model "
           "with 2 heads, qkv 16, mlp 32, MEAN pooling, learned positions, 16,384 tokens; "
           "LRA has only a Transformer config for it, so every baseline keeps these sizes",
    train_examples=_PATHFINDER_TRAIN,
    data_options=_pathfinder_data(128),
    model_options={"classifier_pool": "MEAN", "learn_pos_emb": True},
    # A smoke test of 16,384-token training, not a result.
    variants={"tiny": Variant(batch_size=8, num_train_steps=200, warmup=50, eval_frequency=100,
                              num_eval_steps=25, num_test_steps=25,
                              options={"data.num_images": 2000})},
    pretraining={"spt": SptRecipe(5e-4, 0.0, 5000, 32, 200),
                 "ft": SptRecipe(5e-4, 0.0, 5000, 32, 200)},
    published=_published((None,) * len(_LRA_TABLE1)),   # FAIL for every model
))

register(TaskSpec(
    name="agnews", reader=_load_agnews, vocab_size=None, num_classes=agnews.NUM_CLASSES,
    max_length=128,
    model=ModelSize(emb_dim=768, num_heads=12, qkv_dim=768, mlp_dim=3072, num_layers=12),
    # 35,625 steps = 10 epochs of the 114,000 training articles at batch 32, 10% warmup.
    recipe=Recipe(num_train_steps=35625, warmup=3562, eval_frequency=1000,
                  checkpoint_every=1000, learning_rate=5e-5,
                  factors="constant * linear_warmup * cosine_decay", weight_decay=1e-3,
                  adam_b2=0.999, adam_eps=1e-8),
    source="SimpleTRON section 5.3 (12 blocks, width 768, 12 heads, MLP 3072, CLS pooling, "
           "learned positions, GELU), the SimpleTRON authors' AG News code (ag/: dropout 0.2, "
           "AdamW lr 5e-5, (0.9, 0.999), eps 1e-8, weight decay 1e-3, batch 32, about 10 "
           "epochs with a 10% warmup) and BERT (Devlin et al., 2019) for the rest; docs/bert.md",
    lra=False, train_examples=114000,
    data_options={"tfds_data_dir": str,   # tfds ag_news_subset
                  "vocab_path": str,      # BERT folder or vocab.txt
                  "lowercase": bool,      # None: as the checkpoint
                  "val_fraction": 0.05, "bucket": 32},
    model_options={
        "max_positions": 512,           # BERT's position table
        "dropout_rate": 0.2, "attention_dropout_rate": 0.2, "learn_pos_emb": True,
        "classifier_pool": "CLS",       # BERT's [CLS] token, position 0
        "head": "dense", "embedding_type": "bert", "type_vocab_size": 2,
        "block_norm": "post", "pooler": True, "final_layer_norm": False,
        "layer_norm_epsilon": 1e-12, "mlp_hidden_dropout": False, "attention_bias": True,
        "mlp_activation": "gelu_exact"},
    variants={"tiny": _AGNEWS_TINY,
              "from_bert": Variant(options={"init_from": AGNEWS_FROM_BERT}),
              "tiny_from_bert": dataclasses.replace(_AGNEWS_TINY, options={
                  **_AGNEWS_TINY.options, "init_from": AGNEWS_FROM_BERT})},
))
