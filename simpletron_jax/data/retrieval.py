"""LRA Retrieval: does one ACL Anthology Network (AAN) paper cite another?

The task follows LRA's ``lra_benchmarks/matching/input_pipeline.py`` with
``tokenizer='char'``. Each example is a pair of documents and a binary label.
Both documents are encoded byte by byte (byte + 1, ids 1..256, 0 = padding,
``VOCAB_SIZE = 257``) and each keeps its first ``max_length`` bytes. A dual
encoder reads the two documents with one shared encoder.

Files (LRA release ``lra_release.gz``, folder ``lra_release/tsv_data``):
``new_aan_pairs.train.tsv``, ``new_aan_pairs.eval.tsv`` (the validation
split) and ``new_aan_pairs.test.tsv``. A line has five tab-separated fields
and there is no header::

  label <TAB> id1 <TAB> id2 <TAB> text1 <TAB> text2

The label is a float (LRA parses it as float32 and casts it to int32, so
``1.0`` and ``1`` both mean 1). LRA reads with ``use_quote_delim=False``, so
quotes are ordinary characters and every tab separates fields; this loader
splits the raw bytes on tabs the same way, so fields of any size are read.

LRA feeds each text field to the byte encoder exactly as stored, and this
loader does the same by default. The released files appear to store each
text as a Python bytes literal such as ``b'Abstract\\nWe ...'`` (other
loaders of these files decode the fields with ``ast.literal_eval``). If so,
LRA's model sees the ``b'`` prefix and the escapes as characters.
``unescape=True`` decodes such a literal back to the bytes it stands for
(a field without the ``b'...'`` form is kept as it is). This changes the
data, so results are then not comparable with LRA.

LRA also clips each text to its first 10,000 bytes before it truncates to
``max_length``. This only matters when ``max_length`` is over 10,000, and
this loader does not apply that clip.
"""

from __future__ import annotations

import codecs
import dataclasses
import logging
import os
from typing import Callable

import numpy as np

from simpletron_jax.data import sources, tasks
from simpletron_jax.data.common import PairedExamples, RaggedExamples, report_truncation
from simpletron_jax.data.text import check_max_length, bytes_to_examples, decode, encode

VOCAB_SIZE = 257
PAD_ID = 0
NUM_CLASSES = 2
SPLIT_FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv",
               "test": "new_aan_pairs.test.tsv"}
"""File name of each split. LRA names the validation split ``eval``."""
SUBDIRS = ("", "tsv_data", os.path.join("lra_release", "tsv_data"),
           os.path.join("lra_release", "lra_release", "tsv_data"))
"""Folders under ``data.data_dir`` searched for the files, in order."""
NUM_FIELDS = 5

__all__ = ["VOCAB_SIZE", "PAD_ID", "NUM_CLASSES", "SPLIT_FILES", "decode", "encode",
           "find_data_dir", "read_split", "load_retrieval", "unescape_bytes_literal"]


def find_data_dir(data_dir: str | None) -> str:
  """The folder that holds the three AAN TSV files.

  Tries ``data_dir`` and the sub-folders in :data:`SUBDIRS`, so ``data_dir``
  may name ``tsv_data`` itself or any of the folders of the extracted
  ``lra_release.gz`` above it.

  Args:
    data_dir: ``data.data_dir`` (``~`` is expanded).

  Returns:
    The first folder that holds all files of :data:`SPLIT_FILES`.

  Raises:
    FileNotFoundError: if none does. The message says where to get the
      files and names ``data.data_dir``.
  """
  how = ("Download lra_release.gz (https://storage.googleapis.com/long-range-arena/"
         "lra_release.gz, see 'Dataset Setup' in https://github.com/google-research/"
         "long-range-arena), extract it with 'tar xzf lra_release.gz', and set data.data_dir "
         "to the folder lra_release/tsv_data or one above it.")
  if not data_dir:
    raise FileNotFoundError(f"data.data_dir is not set; the AAN retrieval files "
                            f"{', '.join(SPLIT_FILES.values())} have no default location. {how}")
  base = os.path.expanduser(data_dir)
  looked = []
  for sub in SUBDIRS:
    folder = os.path.join(base, sub) if sub else base
    if all(os.path.isfile(os.path.join(folder, name)) for name in SPLIT_FILES.values()):
      return folder
    looked.append(folder)
  raise FileNotFoundError(
      f"AAN retrieval files {', '.join(SPLIT_FILES.values())} not found together in any of: "
      f"{'; '.join(looked)} (data.data_dir = {data_dir!r}). {how}")


def unescape_bytes_literal(field: bytes, max_length: int | None = None) -> bytes:
  """The bytes that a Python bytes literal such as ``b'a\\nb'`` stands for.

  A field that is not of the form ``b'...'`` or ``b"..."`` is returned as it
  is. Only the start of a long literal is decoded: every output byte takes
  at most 4 input characters (``\\xhh``), so the first ``4 * max_length``
  characters suffice.

  Args:
    field: the raw field.
    max_length: bytes needed; None decodes all.

  Returns:
    The decoded bytes, at most ``max_length`` of them.

  Raises:
    ValueError: if the literal holds an invalid escape.
  """
  if len(field) < 3 or field[:1] != b"b" or field[1:2] not in (b"'", b'"') or (
      field[-1:] != field[1:2]):
    return field if max_length is None else field[:max_length]
  body = field[2:-1]
  if max_length is not None and len(body) > 4 * max_length:
    body = body[:4 * max_length]
    # The cut may split an escape; drop up to 3 characters until it decodes.
    for trim in range(4):
      try:
        return codecs.escape_decode(body[:len(body) - trim])[0][:max_length]
      except ValueError:
        continue
  return codecs.escape_decode(body)[0][:max_length]


def _parse_label(field: bytes, path: str, line_number: int) -> int:
  try:
    value = float(field)
  except ValueError:
    value = None
  if value not in (0.0, 1.0):
    raise ValueError(f"{path}:{line_number}: label {field[:40].decode('utf-8', 'replace')!r} "
                     f"is not 0 or 1 (written as 0, 1, 0.0 or 1.0)")
  return int(value)


def _full_length(field: bytes, kept: bytes, max_length: int, unescape: bool) -> int:
  """Bytes of a document before truncation (``kept`` is what :func:`read_split` keeps)."""
  if not unescape:
    return len(field)
  if len(kept) < max_length:
    return len(kept)
  try:
    return len(unescape_bytes_literal(field))
  except ValueError:   # the kept prefix decoded; report at least that
    return len(kept)


def read_split(path: str, max_length: int, *, unescape: bool = False,
               split: str | None = None) -> tuple[RaggedExamples, RaggedExamples]:
  """Reads one AAN TSV file into two ragged splits of byte ids.

  Blank lines are skipped; ``\\n`` and ``\\r\\n`` line ends are both read.

  Args:
    path: the TSV file.
    max_length: ``model.max_length``: bytes kept per document.
    unescape: decode ``b'...'`` text fields first (see the module docstring).
    split: the split's name; when given, prints to stderr how many documents of each side
      ``max_length`` cuts and by how many bytes
      (:func:`simpletron_jax.data.common.report_truncation`), when it cuts any.

  Returns:
    ``(doc1, doc2)``: RaggedExamples of ``text1`` and ``text2`` with uint16
    ids in 1..256 and the same int32 ``labels`` array (0 or 1). A document may
    be empty (length 0).

  Raises:
    ValueError: ``{path}:{line}: ...`` for a line without exactly 5 fields, a
      label that is not 0 or 1, or (with ``unescape``) a bad escape.
  """
  check_max_length(max_length)
  docs1: list[bytes] = []
  docs2: list[bytes] = []
  labels: list[int] = []
  full_lengths: tuple[list[int], list[int]] = ([], [])   # bytes before truncation
  with open(path, "rb") as f:
    for line_number, line in enumerate(f, start=1):
      line = line.rstrip(b"\n")
      if line.endswith(b"\r"):
        line = line[:-1]
      if not line.strip():
        continue
      fields = line.split(b"\t")
      if len(fields) != NUM_FIELDS:
        raise ValueError(f"{path}:{line_number}: expected {NUM_FIELDS} tab-separated fields "
                         f"(label, id1, id2, text1, text2), found {len(fields)}")
      labels.append(_parse_label(fields[0], path, line_number))
      if unescape:
        try:
          docs1.append(unescape_bytes_literal(fields[3], max_length))
          docs2.append(unescape_bytes_literal(fields[4], max_length))
        except ValueError as e:
          raise ValueError(f"{path}:{line_number}: bad bytes literal ({e})") from None
      else:
        docs1.append(fields[3][:max_length])
        docs2.append(fields[4][:max_length])
      if split is not None:
        for side, (field, kept) in enumerate(((fields[3], docs1[-1]), (fields[4], docs2[-1]))):
          full_lengths[side].append(_full_length(field, kept, max_length, unescape))
  if split is not None:
    for side, lengths in zip(("first", "second"), full_lengths):
      report_truncation(f"{split} ({side} documents)", lengths, max_length, unit="bytes")
  label_array = np.asarray(labels, dtype=np.int32)
  doc1 = bytes_to_examples(docs1, label_array, max_length)
  doc2 = bytes_to_examples(docs2, label_array, max_length)
  return doc1, RaggedExamples(tokens=doc2.tokens, offsets=doc2.offsets, labels=doc1.labels)


def load_retrieval(*, data_dir: str, max_length: int,
                   unescape: bool = False) -> dict[str, tuple[RaggedExamples, RaggedExamples]]:
  """Loads LRA Retrieval (AAN) as pairs of ragged splits.

  Args:
    data_dir: ``data.data_dir`` (see :func:`find_data_dir`).
    max_length: ``model.max_length``: bytes kept per document (LRA: 4000).
    unescape: see :func:`read_split`. False (the default) matches LRA.

  Returns:
    ``{"train", "val", "test"}`` -> ``(doc1, doc2)``; ``val`` is LRA's
    ``eval`` file. In each pair both splits share one ``labels`` array.

  Raises:
    FileNotFoundError: see :func:`find_data_dir`.
    ValueError: see :func:`read_split`.
  """
  check_max_length(max_length)
  folder = find_data_dir(data_dir)
  logging.info("AAN source: %s", folder)
  return {split: read_split(os.path.join(folder, name), max_length, unescape=unescape,
                           split=split)
          for split, name in SPLIT_FILES.items()}


# ----------------------------------------------------------------------------
# The task's record: its reader and its data command.

DEFAULT_LRA_DIR = os.path.join(tasks.DEFAULT_DATA_ROOT, "lra_release")
"""Searched for the AAN TSVs when ``data.data_dir`` is unset; ``python -m simpletron_jax.data
prepare --task retrieval`` puts them there."""
KNOWN_COUNTS = {"train": 147086, "val": 18090, "test": 17437}   # LRA paper, section 3


def data_dir_of(data: tasks.DataConfig) -> str | None:
  """The folder the retrieval task searches for the AAN TSVs: ``data.data_dir``, else
  :data:`DEFAULT_LRA_DIR` when it holds them, else None."""
  data_dir = data.folder("data_dir")
  if data_dir:
    return data_dir
  try:
    find_data_dir(DEFAULT_LRA_DIR)
  except FileNotFoundError:
    return None
  return os.path.expanduser(DEFAULT_LRA_DIR)


def _load(data: tasks.DataConfig) -> tasks.TaskData:
  data_dir = data_dir_of(data)
  if not data_dir:
    raise FileNotFoundError(
        "config field data.data_dir is unset and ~/data/lra_release holds no AAN files: the "
        "retrieval task needs LRA's new_aan_pairs.{train,eval,test}.tsv (inside lra_release.gz, "
        "https://storage.googleapis.com/long-range-arena/lra_release.gz); run python -m "
        "simpletron_jax.data prepare --task retrieval --from lra_release.gz, or pass "
        "--config.data.data_dir=/path/to/tsv_data")
  pairs = load_retrieval(data_dir=data_dir, max_length=data.max_length,
                         unescape=data.unescape)
  splits = {name: PairedExamples(*pairs[name]) for name in ("train", "val", "test")}
  return tasks.TaskData(**splits, vocab_size=VOCAB_SIZE, num_classes=NUM_CLASSES,
                        source=data_dir)


def _find(data: tasks.DataConfig) -> sources.Where:
  folder = data_dir_of(data)
  if folder is None:
    raise FileNotFoundError("no AAN files in ~/data/lra_release")
  return sources.Where("retrieval", "tsv", find_data_dir(folder), True)


def _prepare(data: tasks.DataConfig, source: str | None, dest: str,
             num_workers: int | None, log: Callable[[str], None]) -> sources.Where | None:
  del num_workers
  if source is None:
    return None
  folder = sources.from_lra("retrieval", source, dest, ["tsv_data"],
                            lambda rest: rest in ([n] for n in SPLIT_FILES.values()), log)
  tsv_dir = find_data_dir(folder)
  if os.path.abspath(os.path.expanduser(DEFAULT_LRA_DIR)) != os.path.abspath(folder):
    log(sources.data_dir_line("retrieval", tsv_dir))
  return _find(dataclasses.replace(data, data_dir=tsv_dir))


def _check(data: tasks.DataConfig, found: sources.Where) -> list[sources.Check]:
  del data
  labels = {split: read_split(os.path.join(found.path, name), 1)[0].labels
            for split, name in SPLIT_FILES.items()}
  return sources.split_checks("retrieval", labels, NUM_CLASSES, KNOWN_COUNTS)


SPEC = tasks.register(tasks.TaskSpec(
    name="retrieval", reader=_load, vocab_size=VOCAB_SIZE, num_classes=NUM_CLASSES,
    max_length=4000, find=_find, prepare=_prepare, check=_check,
    download=sources.LRA_RELEASE, shown="bytes", dual=True,
    data_options={"unescape": False,  # True decodes the b'...' literals of the TSV (not LRA's)
                  "drop_last_eval_batch": False}))  # True: LRA drops the last partial batch
