"""LRA Text: IMDB movie reviews classified from their UTF-8 bytes.

The task follows LRA's ``lra_benchmarks/text_classification/input_pipeline.py``
with ``tokenizer='char'``. A review is encoded byte by byte with the byte
encoder of tfds (``ByteTextEncoder``): byte ``b`` has token id ``b + 1``, so
the ids are 1..256 and id 0 is free for padding (``VOCAB_SIZE = 257``). Each
review keeps only its first ``max_length`` bytes. The label is 0 (negative)
or 1 (positive). IMDB has no validation split. LRA evaluates on the IMDB test
split for both validation and test, so its best-validation checkpoint is chosen on
test; :func:`load_text` instead holds out a seeded ``val_fraction`` (10% in the
configs) of the training reviews, and ``val_fraction=0`` restores LRA's split.

Sources, tried in this order by :func:`load_text`:

1. The tfds data set ``imdb_reviews/plain_text``, when ``tfds_data_dir``
   holds a prepared copy. Nothing is ever downloaded.
2. ``imdb_train.jsonl.gz`` and ``imdb_test.jsonl.gz`` in ``data_dir``: one
   JSON object per line, ``{"id", "rating", "label", "text"}``, the text as
   tfds serves it (the format of the project's offline copy).
3. The original ``aclImdb`` release (Maas et al., 2011), either ``data_dir``
   itself or ``data_dir/aclImdb``: ``{train,test}/{pos,neg}/*.txt``. The text
   is stripped of surrounding whitespace, as the tfds builder does.

:func:`bytes_to_examples` turns byte strings into a
:class:`~simpletron_jax.data.common.RaggedExamples` with numpy alone (no
per-byte Python loop); the retrieval loader reuses it.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import zlib
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from simpletron_jax.data import imdb, sources, tasks
from simpletron_jax.data.common import RaggedExamples, report_truncation, split_train_val
from simpletron_jax.data.tfds_io import find_prepared_tfds, read_tfds_split
from simpletron_jax.runtime import atomic_io

VOCAB_SIZE = 257
"""Token ids are 0 (padding) and 1..256 (byte value + 1)."""
PAD_ID = 0
NUM_CLASSES = 2
CLASSES: tuple[str, ...] = ("neg", "pos")
"""Label names by id, as in tfds ``imdb_reviews``."""
TFDS_NAME = "imdb_reviews/plain_text"
JSONL_FILES = {"train": "imdb_train.jsonl.gz", "test": "imdb_test.jsonl.gz"}

DEFAULT_DATA_DIRS: tuple[str, ...] = (os.path.join("~", "data", "imdb"),)
"""Folders :func:`load_text` searches, in order, when ``data_dir`` is None: where
``python -m simpletron_jax.data prepare --task text`` writes (docs/data.md)."""

_ACL_NAME_RE = re.compile(r"^(\d+)_(\d+)\.txt$")


# ----------------------------------------------------------------------------
# Bytes <-> token ids.


def encode(text: str | bytes, max_length: int | None = None) -> np.ndarray:
  """Token ids of one text: its UTF-8 bytes plus 1.

  Args:
    text: a ``str`` (encoded as UTF-8) or ``bytes``.
    max_length: keep only the first ``max_length`` bytes; None keeps all.

  Returns:
    ``[L]`` int32 array of ids in 1..256, ``L`` the number of bytes kept.
  """
  data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
  if max_length is not None:
    data = data[:max_length]
  return np.frombuffer(data, dtype=np.uint8).astype(np.int32) + 1


def decode(tokens: Sequence[int] | np.ndarray) -> str:
  """The text of a sequence of token ids, the inverse of :func:`encode`.

  Padding ids (0) are dropped wherever they are. A multi-byte UTF-8
  character cut by truncation decodes to U+FFFD.

  Args:
    tokens: ``[L]`` ids in 0..256.

  Returns:
    The decoded text.

  Raises:
    ValueError: if an id is outside 0..256.
  """
  ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
  if ids.size and (ids.min() < 0 or ids.max() > 256):
    raise ValueError(f"token ids must lie in 0..256, found {ids.min()}..{ids.max()}")
  ids = ids[ids > 0]
  return (ids - 1).astype(np.uint8).tobytes().decode("utf-8", errors="replace")


def bytes_to_examples(texts: Sequence[bytes], labels: Sequence[int] | np.ndarray,
                      max_length: int) -> RaggedExamples:
  """Packs byte strings into a ragged split of token ids (byte + 1).

  Only the first ``max_length`` bytes of each text are stored, which bounds
  the memory to ``2 * N * max_length`` bytes (ids are stored as uint16).

  Args:
    texts: N byte strings.
    labels: N class ids.
    max_length: bytes kept per text, > 0.

  Returns:
    A RaggedExamples with uint16 ``tokens`` in 1..256 (never 0), int64
    ``offsets`` and int32 ``labels``; example lengths are in bytes.

  Raises:
    ValueError: if ``max_length`` is not positive or the counts differ.
  """
  check_max_length(max_length)
  if len(texts) != len(labels):
    raise ValueError(f"{len(texts)} texts but {len(labels)} labels")
  clipped = [t[:max_length] for t in texts]
  lengths = np.fromiter(map(len, clipped), dtype=np.int64, count=len(clipped))
  offsets = np.zeros(len(clipped) + 1, dtype=np.int64)
  np.cumsum(lengths, out=offsets[1:])
  flat_u8 = np.frombuffer(b"".join(clipped), dtype=np.uint8)
  tokens = np.add(flat_u8, 1, dtype=np.uint16)
  return RaggedExamples(tokens=tokens, offsets=offsets,
                        labels=np.asarray(labels, dtype=np.int32).reshape(-1))


def check_max_length(max_length: int) -> None:
  """Raises ValueError naming ``model.max_length`` unless it is a positive int."""
  if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or (
      max_length <= 0):
    raise ValueError(f"model.max_length must be a positive int, got {max_length!r}")


# ----------------------------------------------------------------------------
# Local files.


def read_jsonl(path: str) -> tuple[list[bytes], np.ndarray]:
  """Reads reviews from a JSON-lines file (gzip-compressed if it ends in .gz).

  Each non-blank line is an object with at least ``"text"`` (a string) and
  ``"label"`` (0 or 1); other keys (``id``, ``rating``) are ignored.

  Args:
    path: the file.

  Returns:
    ``(texts, labels)``: the UTF-8 bytes of each text and an ``[N]`` int32
    label array, in file order.

  Raises:
    ValueError: ``{path}:{line}: ...`` for a line that is not JSON, not an
      object, or lacks a string ``text`` or a 0/1 ``label``, or whose text holds a lone
      surrogate (no UTF-8 bytes); ``{path}: ...`` for a truncated or corrupt gzip file.
  """
  opener = gzip.open if path.endswith(".gz") else open
  try:
    with opener(path, "rb") as f:
      raw = f.read()
  except (EOFError, gzip.BadGzipFile, zlib.error) as e:  # truncated or not gzip
    raise ValueError(f"{path}: damaged gzip file ({type(e).__name__}: {e})") from None
  texts: list[bytes] = []
  labels: list[int] = []
  for line_number, line in enumerate(raw.split(b"\n"), start=1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except ValueError as e:
      raise ValueError(f"{path}:{line_number}: not valid JSON ({e})") from None
    if not isinstance(record, dict):
      raise ValueError(f"{path}:{line_number}: expected a JSON object, found "
                       f"{type(record).__name__}")
    text, label = record.get("text"), record.get("label")
    if not isinstance(text, str):
      raise ValueError(f"{path}:{line_number}: field 'text' must be a string, found "
                       f"{type(text).__name__}")
    if isinstance(label, bool) or label not in (0, 1):
      raise ValueError(f"{path}:{line_number}: field 'label' must be 0 or 1, found {label!r}")
    try:
      texts.append(text.encode("utf-8"))
    except UnicodeEncodeError as e:   # a lone surrogate: "\ud800" escaped in the JSON
      raise ValueError(f"{path}:{line_number}: field 'text' holds {ascii(e.object[e.start:e.end])} "
                       f"at character {e.start}, a lone UTF-16 surrogate that is not text and "
                       "has no UTF-8 bytes: fix or drop that line (a surrogate pair cut in two "
                       "by a truncation?)") from None
    labels.append(int(label))
  return texts, np.asarray(labels, dtype=np.int32)


def read_acl_imdb(root: str, split: str) -> tuple[list[bytes], np.ndarray]:
  """Reads one split of the original ``aclImdb`` folder.

  Reads ``{root}/{split}/neg/*.txt`` (label 0) and ``{root}/{split}/pos/*.txt``
  (label 1), ordered by label, then by the review id in the file name
  (``{id}_{rating}.txt``). Each text is stripped of leading and trailing ASCII
  whitespace, as the tfds ``imdb_reviews`` builder does.

  Args:
    root: the ``aclImdb`` folder.
    split: ``"train"`` or ``"test"``.

  Returns:
    ``(texts, labels)`` as in :func:`read_jsonl`.

  Raises:
    FileNotFoundError: if ``{root}/{split}/pos`` or ``.../neg`` is missing.
  """
  texts: list[bytes] = []
  labels: list[int] = []
  for label, name in enumerate(CLASSES):
    folder = os.path.join(root, split, name)
    if not os.path.isdir(folder):
      raise FileNotFoundError(f"aclImdb folder {folder} not found (data.data_dir)")
    names = [n for n in os.listdir(folder) if n.endswith(".txt")]
    names.sort(key=lambda n: (int(m.group(1)), n) if (m := _ACL_NAME_RE.match(n)) else (-1, n))
    for n in names:
      with open(os.path.join(folder, n), "rb") as f:
        texts.append(f.read().strip())
      labels.append(label)
  return texts, np.asarray(labels, dtype=np.int32)


def _acl_root(data_dir: str) -> str | None:
  for root in (os.path.join(data_dir, "aclImdb"), data_dir):
    if all(os.path.isdir(os.path.join(root, s, c)) for s in ("train", "test") for c in CLASSES):
      return root
  return None


def _jsonl_paths(data_dir: str) -> dict[str, str] | None:
  """The JSONL files in ``data_dir`` (``.jsonl.gz``, or plain ``.jsonl``), or None."""
  paths = {}
  for split, name in JSONL_FILES.items():
    for candidate in (name, name[:-len(".gz")]):
      if os.path.isfile(os.path.join(data_dir, candidate)):
        paths[split] = os.path.join(data_dir, candidate)
        break
    else:
      return None
  return paths


def find_source(data_dir: str | None, tfds_data_dir: str | None) -> tuple[str, Any]:
  """Decides where :func:`load_text` reads IMDB from.

  Args:
    data_dir: ``data.data_dir``; None searches :data:`DEFAULT_DATA_DIRS`.
    tfds_data_dir: ``data.tfds_data_dir``, or None.

  Returns:
    ``("tfds", version_dir)``, ``("jsonl", {"train": path, "test": path})``
    or ``("aclimdb", root)``.

  Raises:
    FileNotFoundError: if no source is found. The message lists every place
      looked at and names ``data.data_dir``.
  """
  looked: list[str] = []
  if tfds_data_dir:
    version_dir = find_prepared_tfds(tfds_data_dir, TFDS_NAME)
    if version_dir is not None:
      return "tfds", version_dir
    looked.append(f"a prepared tfds {TFDS_NAME} in {tfds_data_dir} (data.tfds_data_dir)")
  candidates = [data_dir] if data_dir else list(DEFAULT_DATA_DIRS)
  for candidate in candidates:
    folder = os.path.expanduser(candidate)
    jsonl = _jsonl_paths(folder)
    if jsonl is not None:
      return "jsonl", jsonl
    root = _acl_root(folder)
    if root is not None:
      return "aclimdb", root
    looked.append(f"{JSONL_FILES['train']} + {JSONL_FILES['test']}, or an aclImdb folder "
                  f"(train/pos, train/neg, test/pos, test/neg), in {folder}")
  raise FileNotFoundError(
      "IMDB data not found. Looked for: " + "; ".join(looked) + ". Set data.data_dir to a "
      "folder with imdb_{train,test}.jsonl.gz or the aclImdb release "
      "(https://ai.stanford.edu/~amaas/data/sentiment/), or data.tfds_data_dir to a tfds "
      "data dir with imdb_reviews prepared.")


def _iter_splits(kind: str, where: Any) -> Iterator[tuple[str, list[bytes], np.ndarray]]:
  for split in ("train", "test"):
    if kind == "tfds":
      records = read_tfds_split(where, split, ("text", "label"))
      texts = [bytes(t) for t in records["text"]]
      labels = np.asarray(records["label"], dtype=np.int32)
    elif kind == "jsonl":
      texts, labels = read_jsonl(where[split])
    else:
      texts, labels = read_acl_imdb(where, split)
    yield split, texts, labels


def load_text(*, data_dir: str | None, tfds_data_dir: str | None, max_length: int, seed: int,
              shuffle_train: bool = True, val_fraction: float = 0.1) -> dict[str, RaggedExamples]:
  """Loads LRA Text (IMDB, byte level) as ragged splits.

  See the module docstring for the sources and their order.

  Args:
    data_dir: ``data.data_dir``: a folder with ``imdb_{train,test}.jsonl.gz``
      or an ``aclImdb`` release. None searches :data:`DEFAULT_DATA_DIRS`.
    tfds_data_dir: ``data.tfds_data_dir``: used first when it holds a
      prepared ``imdb_reviews/plain_text``; None skips tfds.
    max_length: ``model.max_length``: bytes kept per review.
    seed: shuffles the train split (the files are sorted by label) and draws the
      validation reviews.
    shuffle_train: False keeps the source order (for tests).
    val_fraction: ``data.val_fraction``: the share of the 25,000 training reviews held
      out, seeded, for validation, so that checkpoint selection never sees the test
      reviews. 0 reproduces LRA, which validates on the test split.

  Prints to stderr, once per split, how many reviews ``max_length`` cuts and by how many
  bytes (:func:`simpletron_jax.data.common.report_truncation`), when it cuts any.

  Returns:
    ``{"train", "val", "test"}`` RaggedExamples with uint16 ids in 1..256
    and labels 0/1. ``test`` is the 25,000 IMDB test reviews; ``val`` is the held-out
    part of train, or with ``val_fraction=0`` the same object as ``test`` (LRA).

  Raises:
    FileNotFoundError: no source found (see :func:`find_source`).
    ValueError: a malformed JSONL line (``file:line``), a tfds label outside
      0/1, a bad ``max_length``, or ``val_fraction`` outside [0, 1).
    RuntimeError: a tfrecord tfds copy without TensorFlow installed.
  """
  check_max_length(max_length)
  kind, where = find_source(data_dir, tfds_data_dir)
  logging.info("IMDB source: %s %s", kind, where)
  splits: dict[str, RaggedExamples] = {}
  for split, texts, labels in _iter_splits(kind, where):
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
      raise ValueError(f"IMDB {split} labels must be 0 or 1, found {labels.min()}..{labels.max()} "
                       f"in {where}")
    if split == "train" and shuffle_train:
      order = np.random.default_rng(seed).permutation(len(texts))
      texts = [texts[i] for i in order]
      labels = labels[order]
    if split == "train" and val_fraction:
      texts, labels, splits["val"] = _hold_out(texts, labels, val_fraction, seed, max_length)
    report_truncation(split, [len(t) for t in texts], max_length, unit="bytes")
    splits[split] = bytes_to_examples(texts, labels, max_length)
  splits.setdefault("val", splits["test"])
  return splits


def _hold_out(texts: list[bytes], labels: np.ndarray, val_fraction: float, seed: int,
              max_length: int) -> tuple[list[bytes], np.ndarray, RaggedExamples]:
  """Holds out a seeded ``val_fraction`` of the training reviews for validation.

  Returns:
    ``(train texts, train labels, validation split)``; the kept reviews keep their order.

  Raises:
    ValueError: naming ``data.val_fraction`` if it is outside (0, 1).
  """
  train_idx, val_idx = split_train_val(len(texts), val_fraction, seed)
  report_truncation("val", [len(texts[i]) for i in val_idx], max_length, unit="bytes")
  val = bytes_to_examples([texts[i] for i in val_idx], labels[val_idx], max_length)
  return [texts[i] for i in train_idx], labels[train_idx], val



def imdb_jsonl(source: str, out_dir: str) -> dict[str, int]:
  """Makes ``imdb_train.jsonl.gz`` and ``imdb_test.jsonl.gz`` (the format of
  :func:`read_jsonl`) from the ``aclImdb`` release (:func:`simpletron_jax.data.imdb.reviews`).

  Each line is ``{"id", "rating", "label", "text"}``: the id and rating from the file name
  ``{id}_{rating}.txt``, label 0 (``neg``) or 1 (``pos``), the text the file's UTF-8 stripped
  of surrounding whitespace, as tfds's ``imdb_reviews`` serves it; ordered by label, then id
  (the reader shuffles). The gzip headers carry no time, so the same release gives the same
  bytes.

  Args:
    source: ``aclImdb_v1.tar.gz`` or its ``aclImdb`` folder (or one above it).
    out_dir: the folder for the two files.

  Returns:
    Reviews per split.

  Raises:
    DataError: a review that is not UTF-8 (naming it), or a split without reviews.
  """
  records: dict[str, list] = {"train": [], "test": []}
  for split, label, review_id, rating, raw, where_ in imdb.reviews(source):
    try:
      body = raw.strip().decode("utf-8")
    except UnicodeDecodeError as e:
      raise sources.DataError(f"{where_}: not UTF-8 ({e})") from None
    records[split].append((label, review_id, rating, body))
  counts = {}
  for split, rows in records.items():
    if not rows:
      raise sources.DataError(f"{source}: no {imdb.IMDB_DIR}/{split}/{{neg,pos}}/*.txt "
                              f"reviews; expected {imdb.DOWNLOAD.file} ({imdb.DOWNLOAD.url}) "
                              "or its folder")
    rows.sort()
    path = os.path.join(out_dir, JSONL_FILES[split])
    with atomic_io.atomic_path(path) as tmp:
      with open(tmp, "wb") as raw_out, gzip.GzipFile(filename="", mode="wb", fileobj=raw_out,
                                                       mtime=0) as out:
        for label, review_id, rating, body in rows:
          line = {"id": review_id, "rating": rating, "label": label, "text": body}
          out.write(json.dumps(line, ensure_ascii=False).encode("utf-8") + b"\n")
    counts[split] = len(rows)
  return counts


# ----------------------------------------------------------------------------
# The task's record: its reader and its data command.

KNOWN_COUNTS = {"train": 25000, "test": 25000}
PER_CLASS = {"train": 12500, "test": 12500}


def _load(data: tasks.DataConfig) -> tasks.TaskData:
  data_dir, tfds_dir = tasks.source_dirs(data, TFDS_NAME)
  kind, where = find_source(data_dir, tfds_dir)
  splits = load_text(data_dir=data_dir, tfds_data_dir=tfds_dir, max_length=data.max_length,
                     seed=data.seed, val_fraction=data.val_fraction)
  return tasks.TaskData(**splits, vocab_size=VOCAB_SIZE, num_classes=NUM_CLASSES,
                        source=tasks.describe(kind, where))


def _find(data: tasks.DataConfig) -> sources.Where:
  return tasks.found_source("text", *find_source(*tasks.source_dirs(data, TFDS_NAME)))


def _prepare(data: tasks.DataConfig, source: str | None, dest: str,
             num_workers: int | None, log: Callable[[str], None]) -> sources.Where | None:
  del num_workers
  if source is None:
    return None
  out = os.path.join(dest, "imdb")
  log(f"text: {source} -> {out}")
  counts = imdb_jsonl(source, out)
  sources.write_manifest(out, "text", [os.path.join(out, n) for n in JSONL_FILES.values()],
                         source, {"reviews": counts})
  return sources.point_at(sources.Where("text", "jsonl", out, True), _find, data, log)


def _check(data: tasks.DataConfig, found: sources.Where) -> list[sources.Check]:
  del data
  if found.kind == "tfds":
    return sources.count_checks("text", sources.tfds_counts(found.path), KNOWN_COUNTS)
  _, src = find_source(found.path, None)
  labels = {split: (read_jsonl(src[split])[1] if found.kind == "jsonl"
                    else read_acl_imdb(src, split)[1]) for split in ("train", "test")}
  return sources.split_checks("text", labels, NUM_CLASSES, KNOWN_COUNTS, PER_CLASS)


SPEC = tasks.register(tasks.TaskSpec(
    name="text", reader=_load, vocab_size=VOCAB_SIZE, num_classes=NUM_CLASSES,
    max_length=4000, find=_find, prepare=_prepare, check=_check, download=imdb.DOWNLOAD,
    shown="bytes",
    data_options={"tfds_data_dir": str,
                  # IMDB has no validation split: hold out a seeded 10% of train, so the
                  # best-validation checkpoint is not chosen on test. 0: LRA's code, which
                  # validates on the test split.
                  "val_fraction": 0.1}))
