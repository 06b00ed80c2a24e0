"""LRA Image: CIFAR-10 in grayscale, classified pixel by pixel.

The task follows LRA's ``lra_benchmarks/image/input_pipeline.py``
(``get_cifar10_datasets``). Each 32x32 RGB image becomes grayscale with
``tf.image.rgb_to_grayscale`` and is read row by row as a sequence of 1024
tokens; a token is a pixel value 0..255, not normalised
(``VOCAB_SIZE = 256``, ``NUM_CLASSES = 10``).

Pixel value 0 (black) is a real token, so the splits set
``explicit_mask=True`` and every position of an image is marked real. LRA
used its ``token > 0`` mask here too, which treats black pixels as padding;
this is a bug that this module fixes.

LRA splits the 50,000 training images into ``train[:90%]`` and
``train[90%:]`` and tests on the 10,000 test images. :func:`load_image`
draws the 90/10 split with a seed instead. ``lra_split=True``
(``data.lra_split``) takes the first 90% in source order, which is LRA's
split exactly when the source is tfds ``cifar10``: tfds stores the training
images sorted by the MD5 of ``"train"`` and the image's index in
``data_batch_1..5`` (``tensorflow_datasets/image_classification/cifar.py``
keys, ``core/hashing.py``), and ``train[:90%]`` is the first 45,000 stored
(``core/splits.py``). :func:`tfds_order` is that order. An npz made by
``python -m simpletron_jax.data prepare --task image`` from CIFAR-10's python
tarball stores the images in it, with each image's index in the release
(``index_train``, ``index_test``), so ``lra_split=True`` is LRA's split there
too (:func:`npz_in_tfds_order`); this assumes the binary release tfds reads
lists the images in the order of the python release's batches, which is how
the two are published. Another npz (the project's offline copy is in a fixed
random order, without indices) gives LRA's sizes, not its members, and a
warning says so.

Sources, tried in this order:

1. tfds ``cifar10`` (RGB), when ``tfds_data_dir`` holds a prepared copy; the
   images go through :func:`rgb_to_grayscale`. Nothing is downloaded.
2. ``cifar10_gray_uint8.npz`` (already grayscale): arrays ``x_train``
   ``[50000, 32, 32]`` uint8, ``y_train``, ``x_test`` ``[10000, 32, 32]``,
   ``y_test``; optional ``classes`` (the names), ``names_train`` /
   ``names_test`` (the release's file names) and ``index_train`` /
   ``index_test`` (each image's index in the release).
"""

from __future__ import annotations

import hashlib
import logging
import os
import zipfile
import zlib
from typing import Any, Callable

import numpy as np

from simpletron_jax.data import cifar, sources, tasks
from simpletron_jax.data.common import RaggedExamples, split_train_val
from simpletron_jax.data.tfds_io import find_prepared_tfds, read_tfds_split
from simpletron_jax.runtime import atomic_io

VOCAB_SIZE = 256
NUM_CLASSES = 10
IMAGE_SIZE = 32
SEQ_LENGTH = IMAGE_SIZE * IMAGE_SIZE
CLASSES: tuple[str, ...] = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog",
                            "horse", "ship", "truck")
"""Label names by id (CIFAR-10 and tfds order)."""
TFDS_NAME = "cifar10"
NPZ_NAME = "cifar10_gray_uint8.npz"

DEFAULT_DATA_DIRS: tuple[str, ...] = (os.path.join("~", "data", "cifar10"),)
"""Folders :func:`load_image` searches, in order, when ``data_dir`` is None: where
``python -m simpletron_jax.data prepare --task image`` writes (docs/data.md)."""

_RGB_WEIGHTS = np.asarray([0.2989, 0.5870, 0.1140], dtype=np.float32)


def rgb_to_grayscale(rgb: np.ndarray) -> np.ndarray:
  """Grayscale of uint8 RGB images, as ``tf.image.rgb_to_grayscale`` computes it.

  TensorFlow converts uint8 to float32 by multiplying with ``float32(1/255)``,
  takes the dot product with the float32 weights ``(0.2989, 0.5870, 0.1140)``,
  and converts back to uint8 by multiplying with ``255.5`` and casting, which
  truncates. So the result is ``floor(255.5 * gray)``, not ``round(255 *
  gray)``: pure green (0, 255, 0) gives 149, where rounding would give 150.
  The sum here runs in float32 in the order R, G, B; TensorFlow's matmul may
  order it differently, which can move a value by 1 only when ``255.5 *
  gray`` falls within a float32 rounding step of an integer.

  Args:
    rgb: ``[..., 3]`` uint8 images.

  Returns:
    ``[...]`` uint8 grayscale values in 0..255 (the channel axis removed).

  Raises:
    ValueError: if the last axis is not 3 or the dtype is not uint8.
  """
  rgb = np.asarray(rgb)
  if rgb.shape[-1:] != (3,) or rgb.dtype != np.uint8:
    raise ValueError(f"expected [..., 3] uint8 RGB, got shape {rgb.shape} dtype {rgb.dtype}")
  x = rgb.astype(np.float32) * np.float32(1.0 / 255.0)
  gray = x[..., 0] * _RGB_WEIGHTS[0] + x[..., 1] * _RGB_WEIGHTS[1] + x[..., 2] * _RGB_WEIGHTS[2]
  return (gray * np.float32(255.5)).astype(np.uint8)


def tfds_order(n: int, split: str) -> np.ndarray:
  """The order in which tfds stores ``cifar10``'s split ``split`` of ``n`` images.

  tfds's builder (``image_classification/cifar.py``) keys image ``i`` of the release (its
  index over ``data_batch_1..5``, or in ``test_batch``) by the int ``i``, and its writer stores
  a split sorted by ``md5(split name + str(key))`` (``core/hashing.py``: the split name is the
  salt, an int key is hashed as its decimal text).

  Args:
    n: number of images (50,000 train, 10,000 test).
    split: ``"train"`` or ``"test"``.

  Returns:
    ``[n]`` int64: the release indices in stored order.
  """
  salt = hashlib.md5(split.encode("utf-8"))

  def key(i: int) -> bytes:
    md5 = salt.copy()
    md5.update(str(i).encode("utf-8"))
    return md5.digest()
  return np.asarray(sorted(range(int(n)), key=key), dtype=np.int64)


def npz_in_tfds_order(path: str) -> bool:
  """Whether the npz at ``path`` stores its training images in tfds's order
  (:func:`tfds_order`): its ``index_train`` (the release index of each image) is that order.
  False for an npz without ``index_train`` or an unreadable one."""
  try:
    with np.load(path, allow_pickle=False) as z:
      if "index_train" not in z.files:
        return False
      index = np.asarray(z["index_train"], dtype=np.int64)
  except (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error):
    return False
  return bool(np.array_equal(index, tfds_order(len(index), "train")))


def images_to_examples(images: np.ndarray, labels: np.ndarray) -> RaggedExamples:
  """Flattens grayscale images row-major into one ragged split.

  Args:
    images: ``[N, 32, 32]`` uint8.
    labels: ``[N]`` class ids.

  Returns:
    A RaggedExamples of N examples of 1024 uint8 tokens, ``explicit_mask=True``.
  """
  n = images.shape[0]
  return RaggedExamples(tokens=np.ascontiguousarray(images, dtype=np.uint8).reshape(-1),
                        offsets=np.arange(n + 1, dtype=np.int64) * SEQ_LENGTH,
                        labels=np.asarray(labels, dtype=np.int32).reshape(-1),
                        explicit_mask=True)


def _check_arrays(images: np.ndarray, labels: np.ndarray, where: str) -> None:
  if images.ndim != 3 or images.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE) or (
      images.dtype != np.uint8):
    raise ValueError(f"{where}: expected [N, {IMAGE_SIZE}, {IMAGE_SIZE}] uint8 images, got "
                     f"shape {images.shape} dtype {images.dtype}")
  if labels.shape != (images.shape[0],):
    raise ValueError(f"{where}: {images.shape[0]} images but labels of shape {labels.shape}")
  if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
    raise ValueError(f"{where}: labels must lie in 0..{NUM_CLASSES - 1}, found "
                     f"{labels.min()}..{labels.max()}")


def read_npz(path: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Reads the grayscale CIFAR-10 npz.

  Args:
    path: the ``.npz`` file.

  Returns:
    ``{"train": (images, labels), "test": (images, labels)}``, images
    ``[N, 32, 32]`` uint8 and labels ``[N]`` int32.

  Raises:
    ValueError: ``{path}: ...`` if a key is missing, an array has the wrong
      shape or dtype, a label is out of range, ``classes`` differs from
      :data:`CLASSES`, or the file is truncated or not an npz archive.
  """
  try:
    with np.load(path, allow_pickle=False) as z:
      return _read_npz_arrays(path, z)
  except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:  # truncated or not a zip
    raise ValueError(f"{path}: damaged npz file ({type(e).__name__}: {e})") from None


def _read_npz_arrays(path: str, z) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """The checks and arrays of :func:`read_npz` from the open archive ``z``."""
  missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in z.files]
  if missing:
    raise ValueError(f"{path}: missing array(s) {', '.join(missing)}; found {z.files}")
  if "classes" in z.files and tuple(str(c) for c in z["classes"]) != CLASSES:
    raise ValueError(f"{path}: classes {list(z['classes'])} differ from {list(CLASSES)}")
  out = {}
  for split in ("train", "test"):
    try:
      images, labels = z[f"x_{split}"], z[f"y_{split}"].astype(np.int64)
    except (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error) as e:
      raise ValueError(f"{path}: damaged array of the {split} split "
                       f"({type(e).__name__}: {e})") from None
    _check_arrays(images, labels, f"{path} ({split})")
    out[split] = (images, labels.astype(np.int32))
  return out


def read_tfds(version_dir: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Reads tfds ``cifar10`` and converts it to grayscale.

  Args:
    version_dir: a prepared tfds folder (see
      :func:`~simpletron_jax.data.tfds_io.find_prepared_tfds`).

  Returns:
    As :func:`read_npz`, images from :func:`rgb_to_grayscale`.

  Raises:
    ValueError: on wrong shapes or labels.
    RuntimeError: a tfrecord copy without TensorFlow installed.
  """
  out = {}
  for split in ("train", "test"):
    records = read_tfds_split(version_dir, split, ("image", "label"))
    rgb = np.stack(records["image"]) if records["image"] else np.zeros((0, 32, 32, 3), np.uint8)
    images = rgb_to_grayscale(rgb.reshape(-1, IMAGE_SIZE, IMAGE_SIZE, 3))
    labels = np.asarray(records["label"], dtype=np.int64)
    _check_arrays(images, labels, f"{version_dir} ({split})")
    out[split] = (images, labels.astype(np.int32))
  return out


def find_source(data_dir: str | None, tfds_data_dir: str | None) -> tuple[str, str]:
  """Decides where :func:`load_image` reads CIFAR-10 from.

  Args:
    data_dir: ``data.data_dir``: a folder holding :data:`NPZ_NAME`, or the
      ``.npz`` file itself. None searches :data:`DEFAULT_DATA_DIRS`.
    tfds_data_dir: ``data.tfds_data_dir``, or None.

  Returns:
    ``("tfds", version_dir)`` or ``("npz", path)``.

  Raises:
    FileNotFoundError: if no source is found; lists the places looked at and
      names ``data.data_dir``.
  """
  looked = []
  if tfds_data_dir:
    version_dir = find_prepared_tfds(tfds_data_dir, TFDS_NAME)
    if version_dir is not None:
      return "tfds", version_dir
    looked.append(f"a prepared tfds {TFDS_NAME} in {tfds_data_dir} (data.tfds_data_dir)")
  for candidate in ([data_dir] if data_dir else list(DEFAULT_DATA_DIRS)):
    path = os.path.expanduser(candidate)
    if os.path.isdir(path):
      path = os.path.join(path, NPZ_NAME)
    if os.path.isfile(path):
      return "npz", path
    looked.append(path)
  raise FileNotFoundError(
      "CIFAR-10 data not found. Looked for: " + "; ".join(looked) + f". Set data.data_dir to "
      f"a folder with {NPZ_NAME} (arrays x_train, y_train, x_test, y_test of grayscale uint8 "
      f"images), or data.tfds_data_dir to a tfds data dir with cifar10 prepared.")


def load_image(*, data_dir: str | None, tfds_data_dir: str | None, seed: int,
               val_fraction: float = 0.1, lra_split: bool = False) -> dict[str, RaggedExamples]:
  """Loads LRA Image (CIFAR-10 grayscale, 1024 pixel tokens) as ragged splits.

  Args:
    data_dir: ``data.data_dir`` (see :func:`find_source`).
    tfds_data_dir: ``data.tfds_data_dir``: used first when it holds a
      prepared ``cifar10``; None skips tfds.
    seed: ``data.seed``: seeds the train/validation split.
    val_fraction: ``data.val_fraction``: share of the 50,000 training images
      held out for validation.
    lra_split: ``data.lra_split``: LRA's ``train[:90%]`` / ``train[90%:]``
      (``lra_benchmarks/image/input_pipeline.py``, ``get_cifar10_datasets``), see
      :func:`~simpletron_jax.data.common.split_train_val`. Exact with a tfds source and with
      an npz in tfds's order (:func:`npz_in_tfds_order`); with another npz the sizes only
      (the module docstring says why).

  Returns:
    ``{"train", "val", "test"}`` RaggedExamples (45,000 / 5,000 / 10,000 for
    CIFAR-10 with ``val_fraction=0.1``): uint8 tokens 0..255, 1024 per
    example, ``explicit_mask=True``, labels 0..9 (names in :data:`CLASSES`).

  Raises:
    FileNotFoundError, ValueError, RuntimeError: see :func:`find_source`,
      :func:`read_npz`, :func:`read_tfds` and
      :func:`~simpletron_jax.data.common.split_train_val`.
  """
  kind, where = find_source(data_dir, tfds_data_dir)
  logging.info("CIFAR-10 source: %s %s", kind, where)
  if lra_split and kind != "tfds" and not npz_in_tfds_order(where):
    logging.warning("data.lra_split=True with the npz source %s: LRA's split sizes, not its "
                    "members (those need tfds cifar10 in data.tfds_data_dir, or an npz made "
                    "by python -m simpletron_jax.data prepare --task image)", where)
  data: dict[str, Any] = read_tfds(where) if kind == "tfds" else read_npz(where)
  images, labels = data["train"]
  train_idx, val_idx = split_train_val(len(labels), val_fraction, seed, lra_split)
  return {"train": images_to_examples(images[train_idx], labels[train_idx]),
          "val": images_to_examples(images[val_idx], labels[val_idx]),
          "test": images_to_examples(*data["test"])}


def cifar_npz(source: str, out_path: str) -> dict[str, int]:
  """Makes the grayscale npz the image task reads from CIFAR-10's python release.

  Grayscale is :func:`rgb_to_grayscale`, the arithmetic of ``tf.image.rgb_to_grayscale``,
  which LRA's image pipeline applies. Each split is stored in the order tfds stores it
  (:func:`tfds_order`), so LRA's ``train[:90%]`` is the first 45,000 images
  (``data.lra_split``).

  Args:
    source: ``cifar-10-python.tar.gz`` or its ``cifar-10-batches-py`` folder
      (:func:`simpletron_jax.data.cifar.read_release`).
    out_path: the ``.npz`` to write (atomically).

  Returns:
    Images per split.

  Writes arrays ``x_train`` ``[50000, 32, 32]`` uint8, ``y_train`` uint8, ``x_test``,
  ``y_test``, ``classes`` (the names), ``names_train`` / ``names_test`` (the release's file
  names) and ``index_train`` / ``index_test`` (each image's index in the release: over
  ``data_batch_1..5``, or in ``test_batch``).

  Raises:
    DataError: a missing or damaged batch (naming it), or labels outside 0..9.
  """
  arrays: dict[str, Any] = {"classes": np.asarray(CLASSES)}
  counts = {}
  for split, (rgb, labels, files) in cifar.read_release(source).items():
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
      raise sources.DataError(f"{source}: {split} labels outside 0..9")
    order = tfds_order(len(labels), split)
    arrays[f"x_{split}"] = rgb_to_grayscale(rgb[order])
    arrays[f"y_{split}"] = labels[order].astype(np.uint8)
    arrays[f"names_{split}"] = np.asarray(files)[order] if files else np.asarray([], "<U1")
    arrays[f"index_{split}"] = order
    counts[split] = int(len(labels))
  with atomic_io.atomic_path(out_path) as tmp:
    with open(tmp, "wb") as f:
      np.savez_compressed(f, **arrays)
  return counts


# ----------------------------------------------------------------------------
# The task's record: its reader and its data command.

KNOWN_COUNTS = {"train": 50000, "test": 10000}
PER_CLASS = {"train": 5000, "test": 1000}


def _load(data: tasks.DataConfig) -> tasks.TaskData:
  data_dir, tfds_dir = tasks.source_dirs(data, TFDS_NAME)
  kind, where = find_source(data_dir, tfds_dir)
  splits = load_image(data_dir=data_dir, tfds_data_dir=tfds_dir, seed=data.seed,
                      val_fraction=data.val_fraction, lra_split=data.lra_split)
  splits = tasks.apply_lra_pixel_mask(data, splits)
  return tasks.TaskData(**splits, vocab_size=VOCAB_SIZE, num_classes=NUM_CLASSES,
                        source=tasks.describe(kind, where))


def _find(data: tasks.DataConfig) -> sources.Where:
  return tasks.found_source("image", *find_source(*tasks.source_dirs(data, TFDS_NAME)))


def _prepare(data: tasks.DataConfig, source: str | None, dest: str,
             num_workers: int | None, log: Callable[[str], None]) -> sources.Where | None:
  del num_workers
  if source is None:
    return None
  out = os.path.join(dest, "cifar10", NPZ_NAME)
  log(f"image: {source} -> {out}")
  counts = cifar_npz(source, out)
  sources.write_manifest(os.path.dirname(out), "image", [out], source, {"images": counts})
  return sources.point_at(sources.Where("image", "npz", out, True), _find, data, log)


def _check(data: tasks.DataConfig, found: sources.Where) -> list[sources.Check]:
  del data
  if found.kind == "tfds":
    return sources.count_checks("image", sources.tfds_counts(found.path), KNOWN_COUNTS,
                                "images")
  checks = []
  if npz_in_tfds_order(found.path):
    checks.append(("ok", f"{found.path}: training images in tfds's order "
                         "(data.lra_split=True is LRA's split)"))
  labels = {split: y for split, (_, y) in read_npz(found.path).items()}
  return checks + sources.split_checks("image", labels, NUM_CLASSES, KNOWN_COUNTS, PER_CLASS,
                                       "images")


SPEC = tasks.register(tasks.TaskSpec(
    name="image", reader=_load, vocab_size=VOCAB_SIZE, num_classes=NUM_CLASSES,
    max_length=SEQ_LENGTH, find=_find, prepare=_prepare, check=_check,
    download=cifar.DOWNLOAD, shown="pixels",
    data_options={
        "bucket": 0,                    # every image is a full sequence
        "tfds_data_dir": str, "val_fraction": 0.1,
        "lra_pixel_mask": False,  # True: LRA's mask token > 0 (black pixels are padding)
        # True: LRA's train[:90%] / train[90%:] in source order (exact with tfds cifar10; with
        # the npz copy LRA's sizes only); False: a seeded 90/10 draw.
        "lra_split": False,
        # True: LRA's batch(drop_remainder=True) on val/test (10,000 test images -> 9,984).
        "drop_last_eval_batch": False}))
