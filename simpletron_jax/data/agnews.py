"""AG News: news topic classification in BERT's WordPiece tokens (SimpleTRON section 5.3).

AG News (Zhang, Zhao & LeCun, "Character-level Convolutional Networks for Text
Classification", 2015) has 120,000 training and 7,600 test articles in four classes, World,
Sports, Business and Sci/Tech (labels 0-3 here, 1-4 in the CSV files). The SimpleTRON
paper's last experiment classifies it with a BERT-base-sized model, from scratch and from
BERT's weights (``configs/agnews/``, ``docs/bert.md``).

Sources, tried in this order by :func:`load_agnews` (nothing is downloaded):

1. The tfds data set ``ag_news_subset`` (features ``title``, ``description``, ``label``
   0-3), when ``tfds_data_dir`` holds a prepared copy.
2. The CSV release in ``data_dir`` (or ``data_dir/ag_news_csv``): ``train.csv`` and
   ``test.csv``, no header, one article a row, every field quoted: the class 1-4, the title
   and the description. The text is kept as the release has it (its ``\\`` line breaks and
   HTML entities such as ``#39;`` included).

An article's text is its title, a space and its description, as Hugging Face's ``ag_news``
builds its ``text``. It is tokenized with BERT's WordPiece (the ``tokenizers`` library's
``BertWordPieceTokenizer``, which makes the ids of ``transformers``' ``BertTokenizer``) from a
checkpoint's ``vocab.txt``: ``[CLS] tokens [SEP]``. An article longer than ``max_length``
tokens keeps its first ``max_length - 1`` and ``[SEP]``, as ``transformers`` truncates; the
cut articles are counted and reported. ``[PAD]`` must be id 0, the padding id of every task
here (the mask is ``token > 0``); BERT's vocabularies have it there.

AG News has no validation split: a seeded ``val_fraction`` (5% in the configs) of train is
held out, so the best-validation checkpoint is never chosen on test.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
from typing import Any, Callable, Sequence

import numpy as np

from simpletron_jax.data import sources, tasks
from simpletron_jax.data.common import RaggedExamples, report_truncation, split_train_val
from simpletron_jax.data.tfds_io import find_prepared_tfds, read_tfds_split

NUM_CLASSES = 4
CLASSES: tuple[str, ...] = ("World", "Sports", "Business", "Sci/Tech")
"""Label names by id (the CSV's class 1-4 is id 0-3), as in tfds ``ag_news_subset``."""
TFDS_NAME = "ag_news_subset"
CSV_FILES = {"train": "train.csv", "test": "test.csv"}
VOCAB_FILE = "vocab.txt"
TOKENIZER_CONFIG = "tokenizer_config.json"
PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
WHERE_TO_GET = (
    "the CSV release of Zhang et al. (2015) (ag_news_csv: train.csv, test.csv), or tfds "
    "ag_news_subset prepared once with tensorflow_datasets on a machine with network access")


# ----------------------------------------------------------------------------
# The tokenizer.


def vocab_file(vocab_path: str) -> str:
  """The ``vocab.txt`` named by ``data.vocab_path``: the file itself, or the one in a folder
  (a Hugging Face BERT checkpoint).

  Raises:
    FileNotFoundError: naming ``data.vocab_path`` when there is none.
  """
  path = os.path.expanduser(vocab_path)
  if os.path.isdir(path):
    path = os.path.join(path, VOCAB_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f"data.vocab_path={vocab_path!r}: no {VOCAB_FILE} there. Set it to a BERT "
        "checkpoint folder (e.g. bert-base-cased, the paper's tokenizer; docs/bert.md) or "
        "to its vocab.txt")
  return path


def read_vocab(path: str) -> list[str]:
  """The tokens of a BERT ``vocab.txt``, one a line, by id.

  Raises:
    ValueError: naming ``path`` when a special token (``[PAD]``, ``[UNK]``, ``[CLS]``,
      ``[SEP]``) is missing, ``[PAD]`` is not id 0, or a token is listed twice.
  """
  with open(path, encoding="utf-8") as f:
    tokens = [line.rstrip("\n").rstrip("\r") for line in f]
  while tokens and not tokens[-1]:
    tokens.pop()
  ids: dict[str, int] = {}
  for i, token in enumerate(tokens):
    if token in ids:
      raise ValueError(f"{path}:{i + 1}: token {token!r} is listed twice (first at line "
                       f"{ids[token] + 1})")
    ids[token] = i
  missing = [t for t in (PAD, UNK, CLS, SEP) if t not in ids]
  if missing:
    raise ValueError(f"{path}: not a BERT vocabulary, it lacks {missing}")
  if ids[PAD] != 0:
    raise ValueError(f"{path}: {PAD} is id {ids[PAD]}; it must be id 0, the padding id "
                     "(the mask is token > 0)")
  return tokens


def is_cased(tokens: Sequence[str]) -> bool:
  """True when a word of the vocabulary (special tokens ``[...]`` aside) has an upper-case
  letter: a cased BERT (``bert-base-cased``), whose tokenizer must not lowercase."""
  return any(any(c.isupper() for c in t) for t in tokens if not t.startswith("["))


def lowercase_of(path: str, tokens: Sequence[str], lowercase: bool | None) -> bool:
  """Whether the tokenizer lowercases: ``lowercase`` (``data.lowercase``) when set, else the
  ``do_lower_case`` of a ``tokenizer_config.json`` beside the vocabulary, else
  ``not is_cased(tokens)``."""
  if lowercase is not None:
    return bool(lowercase)
  config = os.path.join(os.path.dirname(path), TOKENIZER_CONFIG)
  if os.path.isfile(config):
    with open(config) as f:
      value = json.load(f).get("do_lower_case")
    if isinstance(value, bool):
      return value
  return not is_cased(tokens)


@dataclasses.dataclass(frozen=True)
class WordPiece:
  """BERT's tokenizer from a ``vocab.txt``.

  Attributes:
    tokenizer: a ``tokenizers`` ``BertWordPieceTokenizer`` (BERT's normaliser, pre-tokenizer
      and WordPiece model; ``[CLS] ... [SEP]`` added).
    vocab_size: ids lie in ``[0, vocab_size)``.
    lowercase: whether it lowercases (and strips accents), as an uncased BERT.
    path: the vocabulary file.
  """

  tokenizer: Any
  vocab_size: int
  lowercase: bool
  path: str

  @property
  def sep_id(self) -> int:
    """The id of ``[SEP]``."""
    return int(self.tokenizer.token_to_id(SEP))

  def encode(self, texts: Sequence[str], max_length: int) -> tuple[RaggedExamples, np.ndarray]:
    """Token ids of ``texts``, truncated as ``transformers`` truncates.

    Args:
      texts: N strings.
      max_length: tokens kept per text, ``[CLS]`` and ``[SEP]`` included (>= 2).

    Returns:
      ``(examples, lengths)``: ``examples`` with labels 0 (set them with
      ``dataclasses.replace``), ids ``[CLS] w_1 .. w_n [SEP]`` cut to ``[CLS] w_1 ..
      w_{max_length-2} [SEP]``, stored as uint16 when the vocabulary allows; ``lengths`` is
      ``[N]`` int64, each text's length before the cut.

    Raises:
      ValueError: naming ``model.max_length`` when it is below 2.
    """
    if max_length < 2:
      raise ValueError(f"model.max_length={max_length}: BERT's inputs need at least 2 "
                       "tokens ([CLS] and [SEP])")
    encodings = self.tokenizer.encode_batch(list(texts))
    sep = self.sep_id
    ids = [e.ids for e in encodings]
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    kept = [x if len(x) <= max_length else x[:max_length - 1] + [sep] for x in ids]
    dtype = np.uint16 if self.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    examples = RaggedExamples.from_sequences([np.asarray(x) for x in kept],
                                             np.zeros(len(kept), np.int32), dtype=dtype)
    return examples, lengths


def make_tokenizer(vocab_path: str, lowercase: bool | None = None) -> WordPiece:
  """BERT's WordPiece tokenizer from ``data.vocab_path`` (see :func:`vocab_file`).

  Args:
    vocab_path: a ``vocab.txt`` or a folder holding one.
    lowercase: ``data.lowercase``; None: as the checkpoint says (:func:`lowercase_of`).

  Returns:
    A :class:`WordPiece`.

  Raises:
    FileNotFoundError, ValueError: see :func:`vocab_file`, :func:`read_vocab`.
    ImportError: without the ``tokenizers`` package.
  """
  path = vocab_file(vocab_path)
  tokens = read_vocab(path)
  lower = lowercase_of(path, tokens, lowercase)
  try:
    from tokenizers.implementations import (  # pylint: disable=import-outside-toplevel
        BertWordPieceTokenizer)
  except ImportError:
    raise ImportError("the agnews task tokenizes with the tokenizers package "
                      "(pip install tokenizers)") from None
  tokenizer = BertWordPieceTokenizer({t: i for i, t in enumerate(tokens)}, lowercase=lower)
  return WordPiece(tokenizer=tokenizer, vocab_size=len(tokens), lowercase=lower, path=path)


# ----------------------------------------------------------------------------
# The articles.


def read_csv(path: str) -> tuple[list[str], np.ndarray]:
  """Reads one file of the CSV release.

  Args:
    path: ``train.csv`` or ``test.csv``: rows ``class (1-4), title, description``, no header.

  Returns:
    ``(texts, labels)``: ``title + " " + description`` per row and ``[N]`` int32 labels 0-3,
    in file order.

  Raises:
    ValueError: ``{path}:{line}: ...`` for a row without three fields or a class outside
      1-4.
  """
  texts: list[str] = []
  labels: list[int] = []
  with open(path, encoding="utf-8", newline="") as f:
    reader = csv.reader(f)
    for row in reader:
      if not row or (len(row) == 1 and not row[0].strip()):
        continue
      where = f"{path}:{reader.line_num}"
      if len(row) != 3:
        raise ValueError(f"{where}: expected 3 fields (class, title, description), found "
                         f"{len(row)}")
      if row[0].strip() not in ("1", "2", "3", "4"):
        raise ValueError(f"{where}: the class must be 1-4, found {row[0]!r}")
      labels.append(int(row[0]) - 1)
      texts.append(f"{row[1]} {row[2]}")
  return texts, np.asarray(labels, dtype=np.int32)


def _csv_paths(data_dir: str) -> dict[str, str] | None:
  for folder in (data_dir, os.path.join(data_dir, "ag_news_csv")):
    paths = {s: os.path.join(folder, n) for s, n in CSV_FILES.items()}
    if all(os.path.isfile(p) for p in paths.values()):
      return paths
  return None


def find_source(data_dir: str | None, tfds_data_dir: str | None) -> tuple[str, Any]:
  """Decides where :func:`load_agnews` reads AG News from.

  Returns:
    ``("tfds", version_dir)`` or ``("csv", {"train": path, "test": path})``.

  Raises:
    FileNotFoundError: naming ``data.data_dir`` and ``data.tfds_data_dir``, every place
      looked at, and where to get the data.
  """
  looked: list[str] = []
  if tfds_data_dir:
    version_dir = find_prepared_tfds(tfds_data_dir, TFDS_NAME)
    if version_dir is not None:
      return "tfds", version_dir
    looked.append(f"a prepared tfds {TFDS_NAME} in {tfds_data_dir} (data.tfds_data_dir)")
  if data_dir:
    folder = os.path.expanduser(data_dir)
    paths = _csv_paths(folder)
    if paths is not None:
      return "csv", paths
    looked.append(f"train.csv and test.csv in {folder} or {folder}/ag_news_csv "
                  "(data.data_dir)")
  raise FileNotFoundError(
      "AG News not found" + (f"; looked for {'; '.join(looked)}" if looked else
                             ": data.data_dir and data.tfds_data_dir are unset")
      + f". Get {WHERE_TO_GET}; see docs/bert.md")


def _read_split(kind: str, where: Any, split: str) -> tuple[list[str], np.ndarray]:
  if kind == "csv":
    return read_csv(where[split])
  records = read_tfds_split(where, split, ("title", "description", "label"))
  texts = [f"{_text(t)} {_text(d)}" for t, d in zip(records["title"], records["description"])]
  labels = np.asarray(records["label"], dtype=np.int32)
  if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
    raise ValueError(f"{where}: tfds {TFDS_NAME} {split} labels must be 0-3, found "
                     f"{labels.min()}..{labels.max()}")
  return texts, labels


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, (bytes, np.bytes_)) else str(value)


def load_agnews(*, data_dir: str | None, tfds_data_dir: str | None, vocab_path: str | None,
                max_length: int, seed: int, val_fraction: float = 0.05,
                lowercase: bool | None = None
                ) -> tuple[dict[str, RaggedExamples], WordPiece, dict[str, int]]:
  """Loads AG News as BERT token ids.

  Args:
    data_dir: ``data.data_dir``: the CSV release (see the module docstring).
    tfds_data_dir: ``data.tfds_data_dir``: used first when it holds a prepared
      ``ag_news_subset``.
    vocab_path: ``data.vocab_path``: a BERT checkpoint folder or its ``vocab.txt``.
    max_length: ``model.max_length``: tokens per article, ``[CLS]`` and ``[SEP]`` included.
    seed: draws the validation articles.
    val_fraction: ``data.val_fraction``: the share of train held out for validation, in
      (0, 1).
    lowercase: ``data.lowercase``; None: as the checkpoint says (:func:`lowercase_of`).

  Prints to stderr, per split, how many articles ``max_length`` cuts and by how many tokens
  (:func:`simpletron_jax.data.common.report_truncation`), when it cuts any.

  Returns:
    ``(splits, tokenizer, truncated)``: ``{"train", "val", "test"}`` RaggedExamples (ids in
    ``[0, tokenizer.vocab_size)``, 0 never inside an article, labels 0-3); the
    :class:`WordPiece` used; the number of cut articles per split.

  Raises:
    FileNotFoundError: no data (:func:`find_source`) or no vocabulary (naming
      ``data.vocab_path``).
    ValueError: a malformed CSV row (``file:line``), a bad vocabulary, ``val_fraction``
      outside (0, 1) (naming ``data.val_fraction``) or ``max_length`` below 2.
    RuntimeError: a tfrecord tfds copy without TensorFlow installed.
  """
  if not vocab_path:
    raise FileNotFoundError(
        "config field data.vocab_path is unset: AG News is tokenized with a BERT "
        "vocabulary; set it to a BERT checkpoint folder holding vocab.txt (docs/bert.md)")
  tokenizer = make_tokenizer(vocab_path, lowercase)
  kind, where = find_source(data_dir, tfds_data_dir)
  logging.info("AG News source: %s %s; vocabulary %s (lowercase=%s)", kind, where,
               tokenizer.path, tokenizer.lowercase)
  splits: dict[str, RaggedExamples] = {}
  truncated: dict[str, int] = {}
  for split in ("train", "test"):
    texts, labels = _read_split(kind, where, split)
    examples, lengths = tokenizer.encode(texts, max_length)
    parts = {split: np.arange(len(texts))}
    if split == "train":
      parts = dict(zip(("train", "val"), split_train_val(len(texts), val_fraction, seed)))
    for name, idx in parts.items():
      report_truncation(name, lengths[idx], max_length)
      truncated[name] = int(np.sum(lengths[idx] > max_length))
      splits[name] = _subset(examples, idx, labels[idx])
  return splits, tokenizer, truncated


def _subset(examples: RaggedExamples, idx: np.ndarray, labels: np.ndarray) -> RaggedExamples:
  """The examples ``idx`` of ``examples`` (in that order) with ``labels``."""
  seqs = [examples.example(int(i)) for i in idx]
  return RaggedExamples.from_sequences(seqs, labels, dtype=examples.tokens.dtype)


# ----------------------------------------------------------------------------
# The task's record: its reader and its data command.

DEFAULT_DIR = os.path.join(tasks.DEFAULT_DATA_ROOT, "ag_news_csv")
"""Searched for ``train.csv`` and ``test.csv`` when no source is set."""
DOWNLOAD = sources.Download("ag_news_csv.tgz",
                            "https://s3.amazonaws.com/fast-ai-nlp/ag_news_csv.tgz", None,
                            "AG News CSV release (Zhang et al., 2015)")
RELEASE_FILES = ("train.csv", "test.csv", "classes.txt")
KNOWN_COUNTS = {"train": 120000, "test": 7600}
PER_CLASS = {"train": 30000, "test": 1900}


def source_dirs(data: tasks.DataConfig) -> tuple[str | None, str | None]:
  """As :func:`simpletron_jax.data.tasks.source_dirs` for ``ag_news_subset``, with
  :data:`DEFAULT_DIR` as the default CSV folder when it holds ``train.csv`` and
  ``test.csv``."""
  data_dir, tfds_dir = tasks.source_dirs(data, TFDS_NAME)
  default = os.path.expanduser(DEFAULT_DIR)
  if data_dir is None and tfds_dir is None and all(
      os.path.isfile(os.path.join(default, name)) for name in CSV_FILES.values()):
    data_dir = default
  return data_dir, tfds_dir


def copy_release(source: str, out_dir: str) -> list[str]:
  """Copies ``train.csv``, ``test.csv`` (and ``classes.txt``) of the AG News CSV release (the
  tarball or its folder) into ``out_dir``.

  Raises:
    DataError: ``train.csv`` or ``test.csv`` is missing (naming the source).
  """
  written = []
  if os.path.isdir(source):
    folder = next((f for f in (source, os.path.join(source, "ag_news_csv"))
                   if os.path.isfile(os.path.join(f, "train.csv"))), source)
    for name in RELEASE_FILES:
      if os.path.isfile(os.path.join(folder, name)):
        with open(os.path.join(folder, name), "rb") as src:
          sources.copy_stream(src, os.path.join(out_dir, name))
        written.append(os.path.join(out_dir, name))
  else:
    for parts, open_member in sources.iter_tar(source):
      if parts[-1] in RELEASE_FILES and (len(parts) == 1 or parts[-2] == "ag_news_csv"):
        with open_member() as src:
          sources.copy_stream(src, os.path.join(out_dir, parts[-1]))
        written.append(os.path.join(out_dir, parts[-1]))
  missing = [n for n in RELEASE_FILES[:2] if os.path.join(out_dir, n) not in written]
  if missing:
    raise sources.DataError(f"{source}: no ag_news_csv/{', '.join(missing)}; expected "
                            f"{DOWNLOAD.file} ({DOWNLOAD.url}) or its folder")
  return written


def _load(data: tasks.DataConfig) -> tasks.TaskData:
  data_dir, tfds_dir = source_dirs(data)
  kind, where = find_source(data_dir, tfds_dir)
  splits, tokenizer, _ = load_agnews(
      data_dir=data_dir, tfds_data_dir=tfds_dir, vocab_path=data.vocab_path,
      max_length=data.max_length, seed=data.seed, val_fraction=data.val_fraction,
      lowercase=data.lowercase)
  return tasks.TaskData(**splits, vocab_size=tokenizer.vocab_size, num_classes=NUM_CLASSES,
                        source=f"{tasks.describe(kind, where)}; vocabulary {tokenizer.path}")


def _find(data: tasks.DataConfig) -> sources.Where:
  return tasks.found_source("agnews", *find_source(*source_dirs(data)))


def _prepare(data: tasks.DataConfig, source: str | None, dest: str,
             num_workers: int | None, log: Callable[[str], None]) -> sources.Where | None:
  del num_workers
  if source is None:
    return None
  out = os.path.join(dest, "ag_news_csv")
  log(f"agnews: {source} -> {out}")
  sources.write_manifest(out, "agnews", copy_release(source, out), source)
  return sources.point_at(sources.Where("agnews", "csv", out, True), _find, data, log)


def _check(data: tasks.DataConfig, found: sources.Where) -> list[sources.Check]:
  del data
  if found.kind == "tfds":
    return sources.count_checks("agnews", sources.tfds_counts(found.path), KNOWN_COUNTS)
  labels = {split: read_csv(os.path.join(found.path, CSV_FILES[split]))[1]
            for split in ("train", "test")}
  return sources.split_checks("agnews", labels, NUM_CLASSES, KNOWN_COUNTS, PER_CLASS)


SPEC = tasks.register(tasks.TaskSpec(
    name="agnews", reader=_load, vocab_size=None, num_classes=NUM_CLASSES, max_length=128,
    find=_find, prepare=_prepare, check=_check, download=DOWNLOAD, shown="tokens", lra=False,
    data_options={"tfds_data_dir": str,   # tfds ag_news_subset
                  "vocab_path": str,      # BERT folder or vocab.txt
                  "lowercase": bool,      # None: as the checkpoint
                  "val_fraction": 0.05, "bucket": 32}))
