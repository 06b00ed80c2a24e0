"""Reading a prepared tfds data set from disk, without downloading (the text and image tasks).

LRA's Text and Image pipelines read IMDB and CIFAR-10 through tfds. Here a tfds copy is one
source among others: :func:`find_prepared_tfds` finds a prepared one in ``data.tfds_data_dir``
and :func:`read_tfds_split` reads a split's features as numpy values. Nothing is ever
downloaded or generated.

Reading needs ``tensorflow-datasets`` (and, for the default ``tfrecord`` format, TensorFlow):
the ``tfds`` extra, ``pip install -e ".[tfds]"``; the rest of the project runs without them.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any, Sequence

from simpletron_jax.runtime import errors

_INSTALL = 'pip install -e ".[tfds]"'


def find_prepared_tfds(tfds_data_dir: str, name: str) -> str | None:
  """The folder of a prepared tfds data set, or None.

  Looks for ``{tfds_data_dir}/{name}/{version}/dataset_info.json``, where
  ``name`` may include a config (``imdb_reviews/plain_text``), and returns the
  highest version found. Folders of unfinished preparations (tfds names them
  ``incomplete.*``) are skipped. Nothing is downloaded or generated.

  Args:
    tfds_data_dir: the tfds data dir (``~`` is expanded).
    name: ``dataset`` or ``dataset/config``.

  Returns:
    The version folder, or None if no prepared copy exists.
  """
  base = os.path.join(os.path.expanduser(tfds_data_dir), *name.split("/"))
  best: tuple[tuple[int, ...], str] | None = None
  for info in glob.glob(os.path.join(glob.escape(base), "*", "dataset_info.json")):
    folder = os.path.dirname(info)
    version = os.path.basename(folder)
    if not re.fullmatch(r"\d+(\.\d+)*", version):
      continue
    key = tuple(int(p) for p in version.split("."))
    if best is None or key > best[0]:
      best = (key, folder)
  return None if best is None else best[1]


def read_tfds_split(version_dir: str, split: str, keys: Sequence[str]) -> dict[str, list[Any]]:
  """Reads the features ``keys`` of one split of a prepared tfds data set.

  The builder is made with ``tfds.builder_from_directory``, which reads only
  the files already in ``version_dir`` (it never downloads and needs no
  builder code). ``array_record`` data are read with the tfds data source,
  which needs no TensorFlow; the default ``tfrecord`` format needs TensorFlow.

  Args:
    version_dir: a folder returned by :func:`find_prepared_tfds`.
    split: a tfds split name such as ``"train"``.
    keys: feature names to keep.

  Returns:
    ``{key: [value per example]}`` with numpy values, in the stored order.

  Raises:
    errors.RunError: (a ``RuntimeError``) tensorflow-datasets is not installed, or the data
      are in ``tfrecord`` format and TensorFlow is not installed. The one-line message names
      the folder, ``data.tfds_data_dir`` and the ``tfds`` extra.
  """
  try:
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise errors.RunError(
        f"reading the tfds copy in {version_dir} (data.tfds_data_dir) needs "
        f"tensorflow-datasets, which is not installed ({e}): {_INSTALL}, or leave "
        "data.tfds_data_dir unset to use the local files in data.data_dir") from None
  builder = tfds.builder_from_directory(version_dir)
  out: dict[str, list[Any]] = {k: [] for k in keys}
  if str(builder.info.file_format).lower().endswith("array_record"):
    source = builder.as_data_source(split=split)
    for i in range(len(source)):
      example = source[i]
      for k in keys:
        out[k].append(example[k])
    return out
  try:
    import tensorflow  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    raise errors.RunError(
        f"the tfds copy in {version_dir} (data.tfds_data_dir) is stored as "
        f"{builder.info.file_format}, which needs TensorFlow to read: {_INSTALL}, or leave "
        "data.tfds_data_dir unset to use the local files in data.data_dir") from None
  for example in tfds.as_numpy(builder.as_dataset(split=split)):
    for k in keys:
      out[k].append(example[k])
  return out
