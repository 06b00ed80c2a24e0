"""Writing a generated Pathfinder level in LRA's file layout, and reusing a finished one.

The files follow LRA's ``lra_release/pathfinder{res}/{level_dir}`` layout:
``imgs/{shard}/sample_{j}.png`` are 8-bit grayscale PNGs. ``metadata/{shard}.npy`` is, despite
its name, a text file with one line per image and space-separated columns. LRA's reader
(``lra_benchmarks/data/pathfinder.py``) uses column 0 (image folder, relative to the level
folder), column 1 (file name) and column 3 (label). The columns written here are:

* ``generator="dashed"`` (the default): those of the original's ``accumulate_meta``
  (``snakes2.py``): ``imgs/{shard} sample_{j}.png j label continuity contour_length
  distractor_length paddle_length paddle_thickness paddle_margin 1``.
* ``generator="solid"``: ``imgs/{shard} sample_{j}.png j label contour_length
  distractor_length num_distractors paddle_length paddle_thickness paddle_margin contrast``.

:func:`generate_dataset` draws image ``i`` with the chosen generator
(:func:`simpletron_jax.data.pathfinder.dashed.render_dashed` from
:func:`~simpletron_jax.data.pathfinder.dashed.dashed_example_rng` ``(seed, params, i)``, or
:func:`simpletron_jax.data.pathfinder.draw.render_example` from
:func:`~simpletron_jax.data.pathfinder.draw.example_rng`) in a pool of spawned processes, so
the files do not depend on the worker count; :func:`ensure_generated` generates only what is
missing or stale. :mod:`simpletron_jax.data.pathfinder.read` reads the result, as it reads
LRA's own release.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import io
import json
import os
import time
from typing import Any

import numpy as np

from simpletron_jax.data import workers as worker_pool
from simpletron_jax.data.pathfinder.dashed import dashed_example_rng, render_dashed_info
from simpletron_jax.data.pathfinder.draw import example_rng, render_example_info
from simpletron_jax.runtime import atomic_io, progress as progress_bar
from simpletron_jax.data.pathfinder.params import (LEVELS, DashedParams, PathfinderParams,
                                                   _level_name, check_generator,
                                                   dashed_params_for, params_for)


IMAGES_PER_SHARD = 1000
"""Images per ``imgs/{shard}`` folder and ``metadata/{shard}.npy`` file."""


def _write_text(path: str, text: str) -> None:
  with atomic_io.atomic_path(path) as tmp:
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
      f.write(text)


def _png_bytes(image: np.ndarray) -> bytes:
  from PIL import Image  # pylint: disable=import-outside-toplevel
  buffer = io.BytesIO()
  Image.fromarray(image, mode="L").save(buffer, format="PNG")
  return buffer.getvalue()


def level_params(generator: str, resolution: int,
                 level: str) -> DashedParams | PathfinderParams:
  """The settings of one generator (``dashed`` or ``solid``), resolution and level.

  Raises:
    ValueError: for a bad generator, resolution or level, naming ``data.generator``,
      ``data.resolution`` or ``data.level``.
  """
  if check_generator(generator) == "dashed":
    return dashed_params_for(resolution, level)
  return params_for(resolution, level)


def render_indexed(generator: str, seed: int, params: DashedParams | PathfinderParams,
                   index: int) -> tuple[np.ndarray, int, dict[str, Any]]:
  """Image ``index`` of a data set: ``(image, label, info)`` from the generator's
  ``render_*_info`` with its per-index random source.

  Raises:
    ValueError: for a bad generator (naming ``data.generator``).
    RuntimeError: when the image cannot be drawn (settings too crowded).
  """
  if check_generator(generator) == "dashed":
    return render_dashed_info(dashed_example_rng(seed, params, index), params)
  return render_example_info(example_rng(seed, params, index), params)


def _render_chunk(task: tuple) -> tuple[int, int, list[int], list[int], list[int]]:
  """Worker: renders images ``start..stop-1`` of one shard and writes their PNGs.

  Args:
    task: ``(generator, seed, params, level_dir, shard, start, stop, images_per_shard)``.

  Returns:
    ``(shard, start, labels, margins, attempts)``.
  """
  generator, seed, params, level_dir, shard, start, stop, per_shard = task
  folder = os.path.join(level_dir, "imgs", str(shard))
  labels, margins, attempts = [], [], []
  for j in range(start, stop):
    image, label, info = render_indexed(generator, seed, params, shard * per_shard + j)
    path = os.path.join(folder, f"sample_{j}.png")
    # One writer per file, so a fixed temporary name is safe; the rename makes it atomic.
    with open(path + ".tmp", "wb") as f:
      f.write(_png_bytes(image))
    os.replace(path + ".tmp", path)
    labels.append(label)
    margins.append(info["margin"])
    attempts.append(info["attempts"])
  return shard, start, labels, margins, attempts


def _default_workers() -> int:
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # Not Linux.
    return os.cpu_count() or 1


_META_FORMAT = "simpletron_jax.data.pathfinder/2"
_DONE_FILE = "simpletron_generated.json"
_CHUNK = 25  # images per worker task


def _metadata_line(shard: int, j: int, label: int, margin: int,
                   p: DashedParams | PathfinderParams) -> str:
  if isinstance(p, DashedParams):   # snakes2.py's accumulate_meta
    return (f"imgs/{shard} sample_{j}.png {j} {label} {p.continuity:g} {p.contour_length} "
            f"{p.distractor_length} {p.paddle_length} {p.paddle_thickness:g} {margin} 1\n")
  return (f"imgs/{shard} sample_{j}.png {j} {label} {p.contour_length} {p.distractor_length} "
          f"{p.num_distractors} {p.paddle_length:g} {p.paddle_thickness:g} {margin} "
          f"{p.contrast:g}\n")


def generate_dataset(out_dir: str, *, seed: int, resolution: int = 32, level: str = "hard",
                     num_images: int, num_workers: int | None = None, progress: bool = True,
                     images_per_shard: int = IMAGES_PER_SHARD,
                     generator: str = "dashed") -> dict[str, Any]:
  """Generates a Pathfinder level and writes it in LRA's layout.

  Writes ``{out_dir}/pathfinder{resolution}/{level_dir}/imgs/{shard}/sample_{j}.png`` and
  ``.../metadata/{shard}.npy`` (text, see the module docstring), where image ``i`` is
  ``j = i % images_per_shard`` of shard ``i // images_per_shard``. Image ``i`` is
  :func:`render_indexed` ``(generator, seed, params, i)``, so the files do not depend on
  ``num_workers``. Every file is written to a temporary name and renamed. A metadata file is
  written once its shard is complete, and ``simpletron_generated.json`` (the arguments, the
  time taken and the redraw statistics) last. Old ``metadata/*.npy`` files are removed first.

  Args:
    out_dir: the root folder, created if missing. Pass it to :func:`load_pathfinder`.
    seed: the data seed.
    resolution: 32 or 128.
    level: ``easy``, ``intermediate`` or ``hard`` (or an LRA folder name).
    num_images: images to make, >= 1.
    num_workers: processes; None means every CPU this process may use, 1 means this process.
    progress: show a progress bar (:func:`simpletron_jax.runtime.progress.bar`) and print the speed.
    images_per_shard: images per shard folder (layout only; the images do not change).
    generator: ``dashed`` (LRA's images, :mod:`.dashed`) or ``solid`` (connected paths,
      :mod:`.draw`); ``data.generator``.

  Returns:
    ``{"level_dir", "num_images", "seconds", "images_per_second", "positive_fraction",
    "redrawn_fraction", "mean_attempts", "generator"}``. ``mean_attempts`` counts drawings
    per image (``solid``: of the whole image, redrawn when the pixel check fails; ``dashed``:
    of the two target contours, redrawn when they get stuck, as in the original);
    ``redrawn_fraction`` is the fraction of images drawn more than once.

  Raises:
    ValueError: for a bad generator, resolution, level, count or worker number.
    RuntimeError: if an image cannot be drawn (see :func:`render_indexed`).
  """
  params = level_params(generator, resolution, level)
  level_dir = os.path.join(os.path.expanduser(out_dir), f"pathfinder{resolution}",
                           LEVELS[_level_name(level)])
  if int(num_images) < 1 or int(images_per_shard) < 1:
    raise ValueError(f"num_images and images_per_shard must be >= 1, got {num_images}, "
                     f"{images_per_shard}")
  workers = _default_workers() if num_workers is None else int(num_workers)
  if workers < 1:
    raise ValueError(f"num_workers must be >= 1, got {num_workers}")
  num_images, per_shard = int(num_images), int(images_per_shard)
  num_shards = -(-num_images // per_shard)
  meta_dir = os.path.join(level_dir, "metadata")
  os.makedirs(meta_dir, exist_ok=True)
  with contextlib.suppress(FileNotFoundError):
    os.unlink(os.path.join(level_dir, _DONE_FILE))
  for old in glob.glob(os.path.join(meta_dir, "*.npy")):
    os.unlink(old)
  tasks = []
  for shard in range(num_shards):
    os.makedirs(os.path.join(level_dir, "imgs", str(shard)), exist_ok=True)
    size = min(per_shard, num_images - shard * per_shard)
    tasks += [(generator, int(seed), params, level_dir, shard, start,
               min(start + _CHUNK, size), per_shard) for start in range(0, size, _CHUNK)]

  labels = np.zeros(num_images, np.int64)
  margins = np.zeros(num_images, np.int64)
  attempts = np.zeros(num_images, np.int64)
  remaining = [min(per_shard, num_images - s * per_shard) for s in range(num_shards)]
  start_time = time.time()
  bar = progress_bar.bar(total=num_images, desc=f"Pathfinder{resolution} {level}",
                         unit="img", disable=not progress, smoothing=0.05)
  # Spawned workers, not forked: the caller may run JAX threads (worker_pool).
  with bar, worker_pool.executor(workers, len(tasks)) as pool:
    for shard, start, lab, mar, att in worker_pool.results(pool, _render_chunk, tasks,
                                                           ordered=False, what="Pathfinder"):
      first = shard * per_shard + start
      labels[first:first + len(lab)] = lab
      margins[first:first + len(lab)] = mar
      attempts[first:first + len(lab)] = att
      bar.update(len(lab))
      remaining[shard] -= len(lab)
      if remaining[shard] == 0:
        base = shard * per_shard
        size = min(per_shard, num_images - base)
        _write_text(os.path.join(meta_dir, f"{shard}.npy"), "".join(
            _metadata_line(shard, j, int(labels[base + j]), int(margins[base + j]), params)
            for j in range(size)))
  seconds = time.time() - start_time
  stats = {"level_dir": level_dir, "num_images": num_images, "seconds": round(seconds, 3),
           "images_per_second": round(num_images / max(seconds, 1e-9), 1),
           "positive_fraction": float(labels.mean()),
           "redrawn_fraction": float((attempts > 1).mean()),
           "mean_attempts": float(attempts.mean()), "generator": generator}
  _write_text(os.path.join(level_dir, _DONE_FILE), json.dumps(
      {"format": _META_FORMAT, "arguments": _generator_args(seed, resolution, level, num_images,
                                                            per_shard, generator),
       "params": dataclasses.asdict(params), "stats": stats}, indent=2, sort_keys=True) + "\n")
  if progress:
    print(f"Pathfinder{resolution} {level} ({generator}): {num_images} images in "
          f"{seconds:.1f} s ({stats['images_per_second']} images/s, {workers} worker(s)); "
          f"{100 * stats['redrawn_fraction']:.2f}% redrawn, {stats['mean_attempts']:.1f} "
          f"drawings per image")
  return stats


def _generator_args(seed: int, resolution: int, level: str, num_images: int,
                    images_per_shard: int, generator: str) -> dict[str, Any]:
  return {"seed": int(seed), "resolution": int(resolution), "level": _level_name(level),
          "num_images": int(num_images), "images_per_shard": int(images_per_shard),
          "generator": generator}


def ensure_generated(cache_dir: str, *, seed: int, resolution: int = 32, level: str = "hard",
                     num_images: int, num_workers: int | None = None, progress: bool = True,
                     images_per_shard: int = IMAGES_PER_SHARD,
                     generator: str = "dashed") -> str:
  """Returns a root folder holding this generated Pathfinder level, generating it if needed.

  The folder is ``{cache_dir}/{generator}_seed{seed}_n{num_images}``. The level is generated
  with :func:`generate_dataset` unless its ``simpletron_generated.json`` exists with the same
  arguments, settings (:class:`DashedParams` or :class:`PathfinderParams`) and format version,
  and every metadata file is present.

  Args:
    cache_dir: parent folder, created if missing.
    seed, resolution, level, num_images, num_workers, progress, images_per_shard, generator:
      as for :func:`generate_dataset` (``num_workers`` and ``progress`` are not part of the
      key).

  Returns:
    The root folder; pass it to :func:`load_pathfinder` as ``data_dir``.

  Raises:
    ValueError, RuntimeError: as :func:`generate_dataset`.
  """
  params = level_params(generator, resolution, level)
  args = _generator_args(seed, resolution, level, num_images, images_per_shard, generator)
  root = os.path.join(os.path.expanduser(cache_dir),
                      f"{generator}_seed{int(seed)}_n{int(num_images)}")
  level_dir = os.path.join(root, f"pathfinder{resolution}", LEVELS[args["level"]])
  try:
    with open(os.path.join(level_dir, _DONE_FILE), encoding="utf-8") as f:
      done = json.load(f)
  except (OSError, ValueError):
    done = None
  shards = -(-int(num_images) // int(images_per_shard))
  up_to_date = (isinstance(done, dict) and done.get("format") == _META_FORMAT
                and done.get("arguments") == args
                and done.get("params") == json.loads(json.dumps(dataclasses.asdict(params)))
                and all(os.path.isfile(os.path.join(level_dir, "metadata", f"{s}.npy"))
                        for s in range(shards)))
  if not up_to_date:
    generate_dataset(root, seed=seed, resolution=resolution, level=level,
                     num_images=num_images, num_workers=num_workers, progress=progress,
                     images_per_shard=images_per_shard, generator=generator)
  return root
