"""Reading a ListOps split from LRA's TSV layout into token ids.

A TSV file has the header ``Source\\tTarget`` and one example per line: the
expression in LRA's parenthesised ``Source`` form
(:mod:`simpletron_jax.data.listops.tokens`) and its label. The trainer reads the
splits with :func:`load_split`, from the folder that
:func:`simpletron_jax.data.listops.generate.ensure_generated` returns or from the
user's, for example LRA's ``lra_release/listops-1000``.
"""

from __future__ import annotations

import os

import numpy as np

from simpletron_jax.data.common import RaggedExamples
from simpletron_jax.data.listops.tokens import _BYTES_TOKEN_ID, NUM_CLASSES, VOCAB


def load_split(data_dir: str, split: str, *, task: str = "basic") -> RaggedExamples:
  """Reads one split of an LRA-format ListOps TSV.

  Reads ``{data_dir}/{task}_{split}.tsv``. This works on the output of
  :func:`generate_dataset` and on LRA's released ``listops-1000`` folder,
  which uses the same names. Each ``Source`` is tokenised as in
  :func:`tokenize`: parentheses dropped, split on whitespace, fixed
  :data:`VOCAB`. Nothing is truncated here; the batcher truncates to the
  model's ``max_length``. Both ``\\n`` and ``\\r\\n`` line ends are read.

  Args:
    data_dir: the folder.
    split: ``"train"``, ``"val"`` or ``"test"``.
    task: the file name prefix. LRA's is ``basic``.

  Returns:
    A :class:`RaggedExamples` with uint8 ``tokens`` (ids 1..15, no padding),
    int64 ``offsets`` and int32 ``labels`` in 0..9. Lengths are in tokens.

  Raises:
    ValueError: on an unknown split name. For a malformed file the message
      starts with ``{path}:{line_number}:``; that covers a missing or wrong
      header, a line without exactly two tab-separated fields, a target that
      is not an int in 0..9, an unknown token and an empty source.
    FileNotFoundError: if the file does not exist. The message says how to
      get the data.
  """
  if split not in ("train", "val", "test"):
    raise ValueError(f"split must be 'train', 'val' or 'test', got {split!r}")
  path = os.path.join(os.path.expanduser(data_dir), f"{task}_{split}.tsv")
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f"ListOps file {path} not found. Leave the data dir unset to generate the data "
        f"(simpletron_jax.data.listops.ensure_generated), make it with "
        f"simpletron_jax.data.listops.generate_dataset, or point the data dir at LRA's release "
        f"folder lra_release/listops-1000 (from lra_release.gz, "
        f"https://github.com/google-research/long-range-arena).")
  # Bytes throughout: bytes.translate drops the parentheses much faster than
  # str.replace, and bytes.split splits on ASCII whitespace like LRA's tokenizer.
  token_id = _BYTES_TOKEN_ID
  chunks: list[bytes] = []
  lengths: list[int] = []
  labels: list[int] = []
  with open(path, "rb") as f:
    header = f.readline()
    if header.rstrip(b"\r\n") != b"Source\tTarget":
      found = repr(header.rstrip(b"\r\n")[:60].decode("utf-8", "replace")) if header else (
          "an empty file")
      raise ValueError(f"{path}:1: expected the header 'Source<TAB>Target', found {found}")
    for line_number, line in enumerate(f, start=2):
      fields = line.rstrip(b"\r\n").split(b"\t")
      if len(fields) != 2:
        raise ValueError(f"{path}:{line_number}: expected 2 tab-separated fields "
                         f"(Source, Target), found {len(fields)}")
      source, target = fields
      target = target.strip()
      if len(target) != 1 or not target.isdigit():
        raise ValueError(f"{path}:{line_number}: Target {target.decode('utf-8', 'replace')!r} "
                         f"is not an integer in 0..{NUM_CLASSES - 1}")
      tokens = source.translate(None, b"()").split()
      if not tokens:
        raise ValueError(f"{path}:{line_number}: empty Source")
      try:
        chunks.append(bytes(map(token_id.__getitem__, tokens)))
      except KeyError as e:
        raise ValueError(f"{path}:{line_number}: unknown token "
                         f"{e.args[0].decode('utf-8', 'replace')!r} in Source; the tokens are "
                         f"{', '.join(VOCAB[1:])}") from None
      lengths.append(len(tokens))
      labels.append(target[0] - 48)
  offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
  np.cumsum(np.asarray(lengths, dtype=np.int64), out=offsets[1:])
  tokens_flat = np.frombuffer(b"".join(chunks), dtype=np.uint8).copy()
  return RaggedExamples(tokens=tokens_flat, offsets=offsets,
                        labels=np.asarray(labels, dtype=np.int32))
