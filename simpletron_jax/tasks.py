"""Task registry: turns ``config.task`` and ``config.data`` into splits and sizes."""

from __future__ import annotations

import dataclasses
import os

import ml_collections

from simpletron_jax.data.common import RaggedExamples

DEFAULT_CACHE = os.path.join("~", ".cache", "simpletron_jax")


@dataclasses.dataclass(frozen=True)
class TaskData:
  """The three splits of a classification task and its sizes.

  Attributes:
    train, val, test: the splits.
    vocab_size: token ids lie in ``[0, vocab_size)``; 0 is padding.
    num_classes: number of labels.
    source: where the data came from (a directory), for the logs.
  """

  train: RaggedExamples
  val: RaggedExamples
  test: RaggedExamples
  vocab_size: int
  num_classes: int
  source: str


def cache_dir(config: ml_collections.ConfigDict) -> str:
  """The data cache: ``config.data.cache_dir``, else ``$SIMPLETRON_JAX_CACHE``,
  else ``~/.cache/simpletron_jax``."""
  path = config.data.get("cache_dir") or os.environ.get("SIMPLETRON_JAX_CACHE") or DEFAULT_CACHE
  return os.path.expanduser(path)


def _load_listops(config: ml_collections.ConfigDict) -> TaskData:
  from simpletron_jax.data import listops  # pylint: disable=import-outside-toplevel
  data = config.data
  data_dir = data.get("data_dir")
  if not data_dir:
    data_dir = listops.ensure_generated(
        os.path.join(cache_dir(config), "listops"), seed=int(data.seed),
        num_train=data.num_train, num_val=data.num_val, num_test=data.num_test,
        min_length=data.min_tokens, max_length=data.max_tokens,
        max_depth=data.max_depth, max_args=data.max_args)
  data_dir = os.path.expanduser(data_dir)
  splits = {s: listops.load_split(data_dir, s, task=data.get("task_name", "basic"))
            for s in ("train", "val", "test")}
  return TaskData(**splits, vocab_size=listops.VOCAB_SIZE, num_classes=listops.NUM_CLASSES,
                  source=data_dir)


_LOADERS = {"listops": _load_listops}


def load_task(config: ml_collections.ConfigDict) -> TaskData:
  """Loads (generating first where the task allows) the data named by ``config.task``.

  Raises:
    ValueError: for an unknown ``config.task``.
    FileNotFoundError: when ``config.data.data_dir`` lacks a split file.
  """
  try:
    loader = _LOADERS[config.task]
  except KeyError:
    raise ValueError(f"unknown task {config.task!r} (config field task); known: "
                     f"{sorted(_LOADERS)}") from None
  return loader(config)
