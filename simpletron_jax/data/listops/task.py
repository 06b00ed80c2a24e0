"""The ``listops`` task's record: its reader and its data command (generated, seeded, into the
cache, or LRA's ``listops-1000`` TSVs), registered in :mod:`simpletron_jax.data.tasks`."""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

from simpletron_jax.data import sources, tasks
from simpletron_jax.data.listops.generate import _generator_args, ensure_generated
from simpletron_jax.data.listops.read import load_split
from simpletron_jax.data.listops.tokens import NUM_CLASSES, VOCAB_SIZE

LRA_COUNTS = {"train": 96000, "val": 2000, "test": 2000}
"""Examples per split of LRA's released ``listops-1000``."""
META = "basic_meta.json"
_FILES = tuple(f"basic_{s}.tsv" for s in sources.SPLITS)
# data field -> generator argument
_ARGS = {"seed": "seed", "num_train": "num_train", "num_val": "num_val", "num_test": "num_test",
         "min_tokens": "min_length", "max_tokens": "max_length", "max_depth": "max_depth",
         "max_args": "max_args"}


def generator_args(data: tasks.DataConfig) -> dict:
  """The :func:`simpletron_jax.data.listops.ensure_generated` arguments of the task's settings
  ``data`` (``cache_dir`` included): the data the listops task generates when
  ``data.data_dir`` is unset."""
  args = {arg: getattr(data, field) for field, arg in _ARGS.items()}
  return dict(cache_dir=os.path.join(data.cache, "listops"), **args)


def _complete(folder: str) -> bool:
  return all(os.path.isfile(os.path.join(folder, name)) for name in _FILES)


def _load(data: tasks.DataConfig) -> tasks.TaskData:
  data_dir = data.folder("data_dir") or ensure_generated(**generator_args(data))
  splits = {s: load_split(data_dir, s, task=data.task_name) for s in sources.SPLITS}
  return tasks.TaskData(**splits, vocab_size=VOCAB_SIZE, num_classes=NUM_CLASSES,
                        source=data_dir)


def _find(data: tasks.DataConfig) -> sources.Where:
  folder = data.folder("data_dir")
  if folder:
    for name in _FILES:
      if not os.path.isfile(os.path.join(folder, name)):
        raise FileNotFoundError(f"no {name} in data.data_dir={data.data_dir!r}")
    return sources.Where("listops", "tsv", folder, True, "set by data.data_dir")
  args = generator_args(data)
  cache = args.pop("cache_dir")
  wanted = _generator_args(**args)
  for folder, meta in sources.cached_sets(cache, META):
    if meta.get("arguments") == wanted and _complete(folder):
      return sources.Where("listops", "generated", folder, True, f"data.seed={args['seed']}")
  return sources.Where("listops", "generated", cache, False,
                       f"made on first use, or now by {sources.COMMAND} prepare --task listops")


def _generated(data: tasks.DataConfig) -> list[tasks.DataConfig]:
  """The settings of each complete generated set in the cache."""
  found = []
  for folder, meta in sources.cached_sets(generator_args(data)["cache_dir"], META):
    args = meta.get("arguments")
    if isinstance(args, dict) and set(args) == set(_ARGS.values()) and _complete(folder):
      found.append(dataclasses.replace(data, **{f: args[arg] for f, arg in _ARGS.items()}))
  return found


def _prepare(data: tasks.DataConfig, source: str | None, dest: str,
             num_workers: int | None, log: Callable[[str], None]) -> sources.Where:
  if source is None:
    folder = ensure_generated(num_workers=num_workers, **generator_args(data))
    sources.write_manifest(folder, "listops", [os.path.join(folder, n) for n in _FILES], None,
                           {"generated": True})
    return _find(data)
  folder = sources.from_lra("listops", source, dest, ["listops-1000"],
                            lambda rest: rest in ([n] for n in _FILES), log)
  found = next((f for f in (folder, os.path.join(folder, "listops-1000"),
                            os.path.join(folder, "lra_release", "listops-1000"))
                if os.path.isfile(os.path.join(f, "basic_train.tsv"))), None)
  if found is None:
    raise sources.DataError(f"{source}: no listops-1000/basic_train.tsv in it; point --from "
                            f"at {sources.LRA_RELEASE.file} or the folder it was unpacked to")
  log(sources.data_dir_line("listops", found))
  return _find(dataclasses.replace(data, data_dir=found))


def _check(data: tasks.DataConfig, found: sources.Where) -> list[sources.Check]:
  labels = {s: load_split(found.path, s).labels for s in sources.SPLITS}
  generated = found.kind == "generated"
  known = ({s: getattr(data, f"num_{s}") for s in sources.SPLITS} if generated
           else LRA_COUNTS)
  return sources.split_checks("listops", labels, NUM_CLASSES, known, generated=generated)


SPEC = tasks.register(tasks.TaskSpec(
    name="listops", reader=_load, vocab_size=VOCAB_SIZE, num_classes=NUM_CLASSES,
    max_length=2000, find=_find, prepare=_prepare, check=_check,
    download=sources.LRA_RELEASE, generated=_generated, shown="tokens",
    data_options={"task_name": "basic",  # files are {task_name}_{train,val,test}.tsv
                  "num_train": 96000, "num_val": 2000, "num_test": 2000,
                  # the generator keeps min_tokens < length < max_tokens
                  "min_tokens": 500, "max_tokens": 2000, "max_depth": 10, "max_args": 10}))
