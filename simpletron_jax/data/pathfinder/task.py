"""The ``pathfinder`` and ``pathx`` tasks' records: their reader and their data command (a level
generated, seeded, into the cache, or LRA's ``pathfinder32``/``pathfinder128`` folders),
registered in :mod:`simpletron_jax.data.tasks`."""

from __future__ import annotations

import dataclasses
import glob
import os
from typing import Any, Callable

import numpy as np

from simpletron_jax.data import sources, tasks
from simpletron_jax.data.pathfinder.generate import (_DONE_FILE, IMAGES_PER_SHARD,
                                                     _generator_args, ensure_generated)
from simpletron_jax.data.pathfinder.params import LEVELS, NUM_CLASSES, VOCAB_SIZE, _level_name
from simpletron_jax.data.pathfinder.read import find_level_dir, load_pathfinder, read_metadata

LRA_IMAGES = 200000
"""Images of each level of LRA's release (its configs train on 160,000, 80% of them)."""


def generator_args(data: tasks.DataConfig) -> dict:
  """The :func:`simpletron_jax.data.pathfinder.ensure_generated` arguments of the task's
  settings ``data`` (``cache_dir`` included): the level the pathfinder and pathx tasks
  generate when ``data.data_dir`` is unset."""
  return dict(cache_dir=os.path.join(data.cache, "pathfinder"), seed=data.seed,
              resolution=data.resolution, level=data.level, num_images=data.num_images,
              generator=data.generator)


def _level_dir(args: dict[str, Any]) -> str:
  return os.path.join(f"pathfinder{args['resolution']}", LEVELS[_level_name(args["level"])])


def _load(data: tasks.DataConfig) -> tasks.TaskData:
  data_dir = data.folder("data_dir") or ensure_generated(**generator_args(data))
  splits = load_pathfinder(data_dir, resolution=data.resolution, level=data.level,
                           seed=data.seed, split_fractions=data.split_fractions,
                           split_hash=data.split_hash)
  splits = tasks.apply_lra_pixel_mask(data, splits)
  return tasks.TaskData(**splits, vocab_size=VOCAB_SIZE, num_classes=NUM_CLASSES,
                        source=data_dir)


def _find(data: tasks.DataConfig) -> sources.Where:
  task = data.task
  if data.data_dir:
    folder = find_level_dir(data.data_dir, data.resolution, data.level)
    return sources.Where(task, "lra", folder, True, "set by data.data_dir")
  args = generator_args(data)
  wanted = _generator_args(args["seed"], args["resolution"], args["level"], args["num_images"],
                           IMAGES_PER_SHARD, args["generator"])
  marker = os.path.join(_level_dir(args), _DONE_FILE)
  for root, done in sources.cached_sets(args["cache_dir"], marker):
    if done.get("arguments") == wanted:
      return sources.Where(task, "generated", root, True,
                           f"{args['generator']}, data.seed={args['seed']}, "
                           f"{args['num_images']} images")
  return sources.Where(task, "generated", args["cache_dir"], False,
                       f"made on first use, or now by {sources.COMMAND} prepare --task {task}")


def _generated(data: tasks.DataConfig) -> list[tasks.DataConfig]:
  """The settings of each level generated into the cache at ``data.resolution``."""
  found = []
  cache = generator_args(data)["cache_dir"]
  for level in LEVELS:
    marker = os.path.join(_level_dir({"resolution": data.resolution, "level": level}),
                          _DONE_FILE)
    for _, done in sources.cached_sets(cache, marker):
      args = done.get("arguments") or {}
      if args.get("images_per_shard") == IMAGES_PER_SHARD:
        found.append(dataclasses.replace(
            data, **{f: args[f] for f in ("seed", "level", "num_images", "generator")}))
  return found


def _prepare(data: tasks.DataConfig, source: str | None, dest: str,
             num_workers: int | None, log: Callable[[str], None]) -> sources.Where:
  resolution, level = data.resolution, data.level
  if source is None:
    ensure_generated(num_workers=num_workers, **generator_args(data))
    found = _find(data)
    level_dir = find_level_dir(found.path, resolution, level)
    sources.write_manifest(level_dir, data.task,
                           sorted(glob.glob(os.path.join(level_dir, "metadata", "*.npy"))),
                           None, {"generated": True})
    return found
  anchor = [f"pathfinder{resolution}", LEVELS[_level_name(level)]]
  folder = sources.from_lra(data.task, source, dest, anchor,
                            lambda rest: rest[0] in ("imgs", "metadata"), log,
                            listed=lambda path: os.sep + "metadata" + os.sep in path)
  find_level_dir(folder, resolution, level)
  log(sources.data_dir_line(data.task, folder))
  return _find(dataclasses.replace(data, data_dir=folder))


def _check(data: tasks.DataConfig, found: sources.Where) -> list[sources.Check]:
  task = data.task
  level_dir = find_level_dir(found.path, data.resolution, data.level)
  checks = []
  if os.path.abspath(level_dir) != os.path.abspath(found.path):
    checks += sources.check_manifest(level_dir)
  rows = read_metadata(level_dir)
  absent = [w for f, n, _, w in rows if not os.path.isfile(os.path.join(level_dir, f, n))]
  checks.append(("FAIL", f"{len(absent)} images listed but absent, the first at {absent[0]}")
                if absent else ("ok", f"{level_dir}: every listed image is there"))
  labels = {"all": np.asarray([label for _, _, label, _ in rows])}
  if found.kind == "generated":
    return checks + sources.split_checks(task, labels, NUM_CLASSES,
                                         {"all": data.num_images}, what="images",
                                         generated=True)
  return checks + sources.split_checks(task, labels, NUM_CLASSES, {"all": LRA_IMAGES},
                                       what="images", strict=False)


def _data_options(resolution: int) -> dict[str, Any]:
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


for _name, _resolution in (("pathfinder", 32), ("pathx", 128)):
  tasks.register(tasks.TaskSpec(
      name=_name, reader=_load, vocab_size=VOCAB_SIZE, num_classes=NUM_CLASSES,
      max_length=_resolution * _resolution, find=_find, prepare=_prepare, check=_check,
      download=sources.LRA_RELEASE, generated=_generated, shown="pixels",
      data_options=_data_options(_resolution)))
