"""Reading a Pathfinder level in LRA's layout and splitting it into train, val and test.

LRA loads one level as a TFDS dataset and takes its ``[:80%]``, ``[80%:90%]`` and ``[90%:]``
slices (``lra_benchmarks/image/input_pipeline.py``). TFDS stores examples in an order set by
a hash of their keys. By default (``data.split_hash="blake2b"``) the images are ordered by a
BLAKE2b hash of ``(seed, folder, file name)`` and then cut in the same proportions: LRA's
sizes, not LRA's members. ``data.split_hash="lra"`` gives LRA's members (:func:`lra_order`):
LRA's builder (``Pathfinder32/128._build_pcollection`` in ``lra_benchmarks/data/
pathfinder.py``) keys each row ``f"{column 0}_{column 1}_{line}"`` (``line``: the row's
1-based line in its metadata file); tfds's writer stores a split sorted by the 128-bit MD5 of
the split name (``easy``/``intermediate``/``hard``, the salt) followed by the key
(``tensorflow_datasets/core/hashing.py``, ``writer.py``), and ``[a%:b%]`` reads the stored
rows ``round(a * n / 100)`` to ``round(b * n / 100)`` (``splits.py``,
``_pct_to_abs_closest``). LRA drops empty PNGs after slicing, so here too. Either way the
split does not depend on the order in which files are listed.
"""

from __future__ import annotations

import glob
import hashlib
import io
import math
import os
import warnings
from typing import Sequence

import numpy as np

from simpletron_jax.data.common import RaggedExamples
from simpletron_jax.data.pathfinder.params import LEVELS, _level_name
from simpletron_jax.runtime import progress as progress_bar


def find_level_dir(data_dir: str, resolution: int, level: str) -> str:
  """The folder of one level inside ``data_dir``.

  Tries, in order: ``{data_dir}/pathfinder{res}/{level_dir}`` (LRA's ``lra_release`` folder or
  a generated root), ``{data_dir}/lra_release/pathfinder{res}/{level_dir}``,
  ``{data_dir}/{level_dir}`` (a ``pathfinder{res}`` folder) and ``data_dir`` itself when it has
  a ``metadata`` folder.

  Raises:
    FileNotFoundError: when none has a ``metadata`` folder; the message names
      ``data.data_dir`` and the paths tried.
  """
  data_dir = os.path.expanduser(data_dir)
  folder = LEVELS[_level_name(level)]
  tries = [os.path.join(data_dir, f"pathfinder{resolution}", folder),
           os.path.join(data_dir, "lra_release", f"pathfinder{resolution}", folder),
           os.path.join(data_dir, folder), data_dir]
  for path in tries:
    if os.path.isdir(os.path.join(path, "metadata")):
      return path
  raise FileNotFoundError(
      f"no Pathfinder {resolution}x{resolution} '{folder}' folder in data.data_dir={data_dir!r}; "
      f"looked for a 'metadata' folder in: {', '.join(tries)}. Point data.data_dir at LRA's "
      f"lra_release folder (from lra_release.gz) or leave it unset to generate the data.")


def _metadata_files(level_dir: str) -> list[str]:
  files = glob.glob(os.path.join(level_dir, "metadata", "*.npy"))
  stem = lambda f: os.path.splitext(os.path.basename(f))[0]  # noqa: E731
  return sorted(files, key=lambda f: (0, int(stem(f)), "") if stem(f).isdigit()
                else (1, 0, stem(f)))


def read_metadata(level_dir: str) -> list[tuple[str, str, int, str]]:
  """Rows of every ``metadata/*.npy`` file of a level, in numeric file order.

  Each file is text: lines of space-separated columns, of which column 0 is the image folder
  (relative to ``level_dir``), column 1 the file name and column 3 the label (as LRA reads
  them). Blank lines are skipped. A real ``.npy`` file (a 2-D string array, one row per
  image, as ``numpy.save`` writes it) is read too.

  Returns:
    ``(folder, file_name, label, where)`` tuples, ``where`` being ``"{metadata file}:{line}"``.

  Raises:
    FileNotFoundError: when there is no metadata file.
    ValueError: on a line with fewer than 4 columns or a label other than 0 or 1, naming the
      file and line; on a file that is neither UTF-8 text nor ``.npy``.
  """
  files = _metadata_files(level_dir)
  if not files:
    raise FileNotFoundError(f"no metadata/*.npy files in {level_dir} (data.data_dir)")
  rows = []
  for path in files:
    with open(path, "rb") as f:
      data = f.read()
    if data.startswith(b"\x93NUMPY"):
      try:
        table = np.load(io.BytesIO(data), allow_pickle=False)
      except ValueError as e:
        raise ValueError(f"{path}: cannot read this .npy metadata file ({e})") from None
      lines = [[str(v) for v in row] for row in np.atleast_2d(table).tolist()]
    else:
      try:
        lines = [line.split() for line in data.decode("utf-8").splitlines()]
      except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not a text metadata file ({e})") from None
    for line_number, cols in enumerate(lines, start=1):
      if not cols:
        continue
      where = f"{path}:{line_number}"
      if len(cols) < 4:
        raise ValueError(f"{where}: expected at least 4 space-separated columns (folder, "
                         f"file, index, label), found {len(cols)}")
      if cols[3] not in ("0", "1"):
        raise ValueError(f"{where}: label (column 3) must be 0 or 1, got {cols[3]!r}")
      rows.append((cols[0], cols[1], int(cols[3]), where))
  return rows


def _split_sizes(n: int, fractions: Sequence[float]) -> tuple[int, int, int]:
  if (len(fractions) != 3 or any(not math.isfinite(f) or f < 0 for f in fractions)
      or abs(sum(fractions) - 1.0) > 1e-6):
    raise ValueError(f"data.split_fractions must be three non-negative numbers summing to 1, "
                     f"got {tuple(fractions)}")
  train_end = int(round(fractions[0] * n))
  val_end = int(round((fractions[0] + fractions[1]) * n))
  return train_end, val_end - train_end, n - val_end


SPLIT_HASHES = ("blake2b", "lra")
"""Values of ``data.split_hash`` (see :func:`load_pathfinder`)."""


def lra_example_key(folder: str, file_name: str, line: int) -> str:
  """The key LRA's tfds builder gives a metadata row.

  ``lra_benchmarks/data/pathfinder.py`` (``_generate_examples`` of every ``Pathfinder*``
  builder) yields ``'_'.join([m_example[0], m_example[1], str(example_id)])``, where
  ``example_id`` counts the lines of one metadata file from 1. That equals the row's line
  number when the file ends with a newline and has no blank lines (LRA's reader fails on a
  blank line and drops a last line without a newline; this reader does neither).

  Args:
    folder: column 0 of the row (the image folder, e.g. ``imgs/0``).
    file_name: column 1 (e.g. ``sample_0.png``).
    line: the row's 1-based line number in its metadata file.

  Returns:
    The key, e.g. ``"imgs/0_sample_0.png_1"``.
  """
  return f"{folder}_{file_name}_{int(line)}"


def lra_hash(key: str, level: str) -> int:
  """tfds's hash of an example key: the 128-bit MD5 of the salt, then the key, in UTF-8.

  The salt is the tfds split name, which for LRA's builders is the level name (``easy``,
  ``intermediate``, ``hard``). This is ``tensorflow_datasets.core.hashing.Hasher(salt)
  .hash_key(key)`` (MD5 since tfds 1.x; tfds's writers store a split sorted by this value).

  Args:
    key: from :func:`lra_example_key`.
    level: ``easy``, ``intermediate``, ``hard`` or an LRA folder name.

  Returns:
    An int in ``[0, 2**128)``.

  Raises:
    ValueError: for a bad level (naming ``data.level``).
  """
  md5 = hashlib.md5(_level_name(level).encode("utf-8"))
  md5.update(key.replace("\\", "/").encode("utf-8"))   # tfds normalises backslashes
  return int(md5.hexdigest(), 16)


def lra_order(rows: Sequence[tuple[str, str, int]], level: str) -> list[int]:
  """Indices of ``rows`` in the order LRA's tfds copy of a level stores them.

  Args:
    rows: ``(folder, file_name, line)`` per metadata row (see :func:`lra_example_key`),
      empty PNGs included (LRA's builder writes them; its pipeline filters them after
      slicing).
    level: the level (the tfds split name; the hash salt).

  Returns:
    A permutation of ``range(len(rows))``: ascending :func:`lra_hash`.

  Raises:
    ValueError: for a bad level, or two rows with the same key (tfds refuses those too).
  """
  hashes = [lra_hash(lra_example_key(*row), level) for row in rows]
  order = sorted(range(len(rows)), key=hashes.__getitem__)
  for a, b in zip(order, order[1:]):
    if hashes[a] == hashes[b]:
      raise ValueError(f"two metadata rows have the same LRA key "
                       f"{lra_example_key(*rows[a])!r} (data.split_hash='lra')")
  return order


def lra_split_bounds(n: int, fractions: Sequence[float]) -> tuple[int, int]:
  """Ends of train and val among ``n`` stored rows, as tfds slices ``[:a%]``, ``[a%:b%]``.

  tfds (``splits.py``, ``_pct_to_abs_closest``, the default ``rounding="closest"``) maps a
  boundary of ``p`` percent to ``int(round(p * n / 100.0))``; LRA's ``[:80%]``, ``[80%:90%]``,
  ``[90%:]`` are ``fractions=(0.8, 0.1, 0.1)``.

  Args:
    n: rows in the level, empty PNGs included.
    fractions: ``data.split_fractions``; each cumulative boundary must be a whole percent.

  Returns:
    ``(train_end, val_end)``.

  Raises:
    ValueError: naming ``data.split_fractions`` when they are not three non-negative numbers
      summing to 1 whose boundaries are whole percents.
  """
  _split_sizes(n, fractions)   # validates
  pcts = []
  for cumulative in (fractions[0], fractions[0] + fractions[1]):
    pct = round(100.0 * float(cumulative))
    if abs(pct - 100.0 * float(cumulative)) > 1e-6:
      raise ValueError(f"data.split_fractions must cut at whole percents with "
                       f"data.split_hash='lra' (tfds slices by percent), got {tuple(fractions)}")
    pcts.append(pct)
  return int(round(pcts[0] * n / 100.0)), int(round(pcts[1] * n / 100.0))


def _decode(path: str, where: str, resolution: int) -> np.ndarray:
  from PIL import Image, UnidentifiedImageError  # pylint: disable=import-outside-toplevel
  try:
    with Image.open(path) as im:
      im.load()
      if im.size != (resolution, resolution):
        raise ValueError(f"{where}: {path} is {im.size[0]}x{im.size[1]} pixels, expected "
                         f"{resolution}x{resolution} (data.resolution={resolution})")
      if im.mode != "L":
        im = im.convert("L")
      return np.asarray(im, dtype=np.uint8)
  except (UnidentifiedImageError, OSError, SyntaxError) as e:
    raise ValueError(f"{where}: cannot decode {path}: {e}") from None


def load_pathfinder(data_dir: str, *, resolution: int, level: str, seed: int,
                    split_fractions: Sequence[float] = (0.8, 0.1, 0.1),
                    progress: bool = True,
                    split_hash: str = "blake2b") -> dict[str, RaggedExamples]:
  """Reads a Pathfinder level in LRA's layout and splits it into train/val/test.

  Works on the output of :func:`generate_dataset` and on LRA's ``lra_release`` folder (see
  :func:`find_level_dir`). Every metadata row is one example. Rows whose PNG is empty (0
  bytes) are skipped with a warning, as LRA's pipeline filters empty images. The rows are
  ordered by a hash and cut by ``split_fractions`` (LRA: 80/10/10), see the module docstring:
  ``split_hash="blake2b"`` hashes ``(seed, folder, file name)`` and drops empty PNGs before
  cutting; ``split_hash="lra"`` is LRA's tfds order (:func:`lra_order`, seed unused), cut as
  tfds cuts percent slices (:func:`lra_split_bounds`) with empty PNGs counted, which are then
  dropped from each part, as in ``get_pathfinder_base_datasets`` of
  ``lra_benchmarks/image/input_pipeline.py``.

  Args:
    data_dir: a folder holding ``pathfinder{resolution}/{level_dir}`` (or see
      :func:`find_level_dir`).
    resolution: image side in pixels (32 for Pathfinder, 128 for Path-X).
    level: ``easy``, ``intermediate``, ``hard`` or an LRA folder name.
    seed: keys the split hash. Keep it fixed to compare runs on the same test set.
    split_fractions: train, val and test fractions, summing to 1.
    progress: show a progress bar while decoding (:func:`simpletron_jax.runtime.progress.bar`).
    split_hash: ``data.split_hash``, one of :data:`SPLIT_HASHES`.

  Returns:
    ``{"train", "val", "test"}`` -> :class:`RaggedExamples` with uint8 tokens (pixel values
    0..255, each image flattened row-major, ``resolution**2`` tokens), labels 0/1 and
    ``explicit_mask=True``.

  Raises:
    FileNotFoundError: when the level folder or its metadata is missing (naming
      ``data.data_dir``), or a row names a PNG that does not exist (naming the metadata
      file and line).
    ValueError: for a malformed metadata row, an undecodable PNG or one of the wrong size
      (file and line), bad ``split_fractions``, a bad level, or a ``split_hash`` not in
      :data:`SPLIT_HASHES` (naming ``data.split_hash``).
  """
  if split_hash not in SPLIT_HASHES:
    raise ValueError(f"data.split_hash must be one of {SPLIT_HASHES}, got {split_hash!r}")
  fractions = tuple(float(f) for f in split_fractions)
  level_dir = find_level_dir(data_dir, resolution, level)
  rows = read_metadata(level_dir)
  listed, empty = [], 0   # (folder, name, label, where, path, is_empty)
  for folder, name, label, where in rows:
    path = os.path.join(level_dir, folder, name)
    try:
      size = os.path.getsize(path)
    except OSError:
      raise FileNotFoundError(f"{where}: image {path} does not exist (data.data_dir="
                              f"{data_dir!r})") from None
    empty += size == 0
    listed.append((folder, name, label, where, path, size == 0))
  if empty:
    warnings.warn(f"skipped {empty} empty PNG file(s) listed in {level_dir}/metadata "
                  f"(LRA's pipeline drops empty images too)")
  if split_hash == "lra":
    # Empty PNGs count in LRA's percent slices; they are dropped from each slice after.
    order = lra_order([(f, n, int(w.rsplit(":", 1)[1])) for f, n, _, w, *_ in listed], level)
    train_end, val_end = lra_split_bounds(len(listed), fractions)
  else:
    listed = [row for row in listed if not row[-1]]
    keys = [hashlib.blake2b(f"{int(seed)}/{folder}/{name}".encode(), digest_size=8).digest()
            for folder, name, *_ in listed]
    order = sorted(range(len(listed)), key=keys.__getitem__)
    n_train, n_val, _ = _split_sizes(len(listed), fractions)
    train_end, val_end = n_train, n_train + n_val
  parts = {"train": order[:train_end], "val": order[train_end:val_end],
           "test": order[val_end:]}
  parts = {split: [i for i in idx if not listed[i][-1]] for split, idx in parts.items()}
  pixels = resolution * resolution
  total = sum(len(idx) for idx in parts.values())
  bar = progress_bar.bar(total=total, desc=f"Reading pathfinder{resolution}", unit="img",
                         disable=not progress or total < 5000)
  splits = {}
  try:
    for split, idx in parts.items():
      tokens = np.empty((len(idx), pixels), np.uint8)
      labels = np.empty(len(idx), np.int32)
      for out, i in enumerate(idx):
        _, _, label, where, path, _ = listed[i]
        tokens[out] = _decode(path, where, resolution).reshape(pixels)
        labels[out] = label
        bar.update(1)
      splits[split] = RaggedExamples(
          tokens=tokens.reshape(-1), offsets=np.arange(len(idx) + 1, dtype=np.int64) * pixels,
          labels=labels, explicit_mask=True)
  finally:
    bar.close()
  return splits
