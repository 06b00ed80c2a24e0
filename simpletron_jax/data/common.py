"""Task-independent containers and batching for LRA classification data.

Every task loader returns a :class:`RaggedExamples`: variable-length token
sequences stored back to back in one flat array, plus one integer label per
example. The trainer turns index lists into padded batches with
:func:`make_batch`, padding each batch only to its longest example rounded up
to a length bucket (the LRA input pipelines pad every batch to ``max_length``).
:func:`split_train_val` holds out the validation part of a training split (the image and
text tasks).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class RaggedExamples:
  """A split of a classification task, stored without padding.

  Attributes:
    tokens: ``[total_tokens]`` integer array, all examples concatenated. Id 0
      is reserved for padding and never appears inside an example, except for
      tasks whose mask is explicit (images), see ``explicit_mask``.
    offsets: ``[N + 1]`` int64 array; example ``i`` is
      ``tokens[offsets[i]:offsets[i + 1]]``.
    labels: ``[N]`` int32 array of class ids.
    explicit_mask: if True every stored token is real even when its id is 0
      (CIFAR pixels); if False the mask is ``token_id > 0`` (LRA convention).
  """

  tokens: np.ndarray
  offsets: np.ndarray
  labels: np.ndarray
  explicit_mask: bool = False

  def __post_init__(self):
    if self.offsets.ndim != 1 or self.offsets.shape[0] != self.labels.shape[0] + 1:
      raise ValueError(
          f"offsets has shape {self.offsets.shape}, expected [N + 1] with "
          f"N = {self.labels.shape[0]} labels")
    if self.offsets[0] != 0 or self.offsets[-1] != self.tokens.shape[0]:
      raise ValueError("offsets must start at 0 and end at len(tokens)")

  @classmethod
  def from_sequences(cls, sequences: Sequence[np.ndarray], labels: Sequence[int],
                     dtype=np.int32, explicit_mask: bool = False) -> "RaggedExamples":
    """Builds the ragged store from a list of 1-D token arrays.

    Args:
      sequences: N integer arrays of shape ``[L_i]``.
      labels: N class ids.
      dtype: storage dtype of the flat token array (uint8 or int16 saves
        memory for small vocabularies).
      explicit_mask: see the class docstring.

    Returns:
      A RaggedExamples with ``len == N``.

    Raises:
      ValueError: if the counts of sequences and labels differ.
    """
    if len(sequences) != len(labels):
      raise ValueError(f"{len(sequences)} sequences but {len(labels)} labels")
    lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
    offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = (np.concatenate([np.asarray(s, dtype=dtype) for s in sequences])
              if len(sequences) else np.zeros((0,), dtype))
    return cls(tokens=tokens, offsets=offsets,
               labels=np.asarray(labels, dtype=np.int32), explicit_mask=explicit_mask)

  def __len__(self) -> int:
    return int(self.labels.shape[0])

  @property
  def lengths(self) -> np.ndarray:
    """``[N]`` int64 array of example lengths in tokens."""
    return np.diff(self.offsets)

  def example(self, i: int) -> np.ndarray:
    """Tokens of example ``i``, shape ``[L_i]``."""
    return self.tokens[self.offsets[i]:self.offsets[i + 1]]

  def majority_rate(self) -> float:
    """Fraction of examples that carry the most frequent label (a baseline)."""
    if len(self) == 0:
      return float("nan")
    return float(np.bincount(self.labels).max() / len(self))


@dataclasses.dataclass(frozen=True)
class PairedExamples:
  """A split of a two-document task (LRA retrieval): ``first[i]`` and ``second[i]`` share
  the label ``labels[i]``.

  Attributes:
    first, second: the documents, as :class:`RaggedExamples` with equal labels.

  Raises:
    ValueError: if the two sides differ in length or labels.
  """

  first: RaggedExamples
  second: RaggedExamples

  def __post_init__(self):
    if len(self.first) != len(self.second) or not np.array_equal(self.first.labels,
                                                                  self.second.labels):
      raise ValueError(f"paired splits disagree: {len(self.first)} and {len(self.second)} "
                       "examples, or different labels")

  def __len__(self) -> int:
    return len(self.first)

  @property
  def labels(self) -> np.ndarray:
    """``[N]`` int32 class ids."""
    return self.first.labels

  @property
  def lengths(self) -> np.ndarray:
    """``[N]`` int64: the longer document of each pair, in tokens (it sets the padding)."""
    return np.maximum(self.first.lengths, self.second.lengths)

  def majority_rate(self) -> float:
    """Fraction of pairs that carry the most frequent label."""
    return self.first.majority_rate()


Split = RaggedExamples | PairedExamples

# One batch as make_batch builds it and the steps read it: ``inputs`` and ``mask`` ``[B, L]``,
# ``targets`` ``[B]`` int32, ``weights`` ``[B]`` float32 (0 for filler rows); retrieval adds
# ``inputs2`` and ``mask2``.
Batch = dict[str, np.ndarray]


def bucketed_length(longest: int, bucket: int, max_length: int) -> int:
  """Rounds ``longest`` up to a multiple of ``bucket``, capped at ``max_length``.

  Args:
    longest: tokens in the longest example of the batch.
    bucket: bucket width in tokens; 0 or negative disables bucketing, so every
      batch is padded to ``max_length`` as in LRA.
    max_length: the config's ``max_length`` in tokens.

  Returns:
    The padded batch length in tokens, at least 1.
  """
  if bucket <= 0:
    return max_length
  padded = -(-max(longest, 1) // bucket) * bucket
  return min(padded, max_length)


def _gather(examples: RaggedExamples, indices: np.ndarray, max_length: int,
            width: int) -> tuple[np.ndarray, np.ndarray]:
  """``(inputs [B, width] int32, mask [B, width] bool)`` of examples truncated to
  ``max_length`` tokens and padded with 0 to ``width``."""
  lengths = np.minimum(examples.lengths[indices], max_length)
  inputs = np.zeros((len(indices), width), dtype=np.int32)
  mask = np.zeros((len(indices), width), dtype=bool)
  for row, (i, n) in enumerate(zip(indices, lengths)):
    start = examples.offsets[i]
    inputs[row, :n] = examples.tokens[start:start + n]
    mask[row, :n] = True
  if not examples.explicit_mask:
    mask &= inputs > 0
  return inputs, mask


def make_batch(examples: Split, indices: np.ndarray, *, max_length: int,
               bucket: int, valid: np.ndarray | None = None) -> Batch:
  """Gathers examples into one padded batch.

  Sequences longer than ``max_length`` are truncated to their first
  ``max_length`` tokens (as LRA does).

  Args:
    examples: the split to read; for :class:`PairedExamples` both documents are padded
      to one width, set by the longest document of the batch.
    indices: ``[B]`` integer indices into ``examples``.
    max_length: truncation length in tokens (per document).
    bucket: length bucket in tokens, see :func:`bucketed_length`.
    valid: optional ``[B]`` bool; False marks filler rows that complete the
      last eval batch and must not count in metrics.

  Returns:
    A dict of numpy arrays: ``inputs`` ``[B, L]`` int32 (0 = pad), ``mask``
    ``[B, L]`` bool (True = real token), ``targets`` ``[B]`` int32 and
    ``weights`` ``[B]`` float32 (1 for real rows, 0 for filler rows), where
    ``L = bucketed_length(longest, bucket, max_length)``. Paired splits add
    ``inputs2`` and ``mask2`` for the second document.
  """
  indices = np.asarray(indices)
  longest = int(np.minimum(examples.lengths[indices], max_length).max(initial=0))
  width = bucketed_length(longest, bucket, max_length)
  weights = np.ones(len(indices), np.float32) if valid is None else valid.astype(np.float32)
  batch = {"targets": examples.labels[indices].astype(np.int32), "weights": weights}
  if isinstance(examples, PairedExamples):
    batch["inputs"], batch["mask"] = _gather(examples.first, indices, max_length, width)
    batch["inputs2"], batch["mask2"] = _gather(examples.second, indices, max_length, width)
  else:
    batch["inputs"], batch["mask"] = _gather(examples, indices, max_length, width)
  return batch


def truncation_report(split: str, lengths: Sequence[int] | np.ndarray, max_length: int,
                      unit: str = "tokens") -> str | None:
  """How many examples of a split ``max_length`` cuts, and by how much.

  LRA truncates every sequence to its first ``max_length`` tokens without a word (ListOps,
  image, Pathfinder: :func:`make_batch`; text and retrieval: their loaders keep the first
  ``max_length`` bytes); this names what is lost.

  Args:
    split: the split's name for the message (``"train"``, ``"val (first documents)"``).
    lengths: ``[N]`` full lengths of its examples, before any truncation.
    max_length: ``model.max_length``.
    unit: what a length counts (``"tokens"``, ``"bytes"``).

  Returns:
    One line, or None when no example is longer than ``max_length``.
  """
  lengths_N = np.asarray(lengths, dtype=np.int64)
  cut_N = lengths_N > max_length
  n_cut = int(cut_N.sum())
  if not n_cut:
    return None
  excess = lengths_N[cut_N] - max_length
  total = max(int(lengths_N.sum()), 1)
  return (f"model.max_length={max_length} truncates {n_cut} of {lengths_N.size} {split} "
          f"examples ({100 * n_cut / lengths_N.size:.1f}%): {int(excess.sum())} of {total} "
          f"{unit} cut ({100 * excess.sum() / total:.1f}%), {excess.mean():.0f} on average "
          f"and at most {int(excess.max())} per cut example (the longest has "
          f"{int(lengths_N.max())}); raise model.max_length to keep them")


def report_truncation(split: str, lengths: Sequence[int] | np.ndarray, max_length: int,
                      unit: str = "tokens") -> str | None:
  """Prints :func:`truncation_report` to stderr (``truncation: ...``) when examples are cut.

  Returns:
    The message, or None when nothing is cut (nothing is printed).
  """
  message = truncation_report(split, lengths, max_length, unit)
  if message:
    print(f"truncation: {message}", file=sys.stderr)
  return message


def report_split_truncation(name: str, examples: Split, max_length: int) -> list[str]:
  """:func:`report_truncation` of a stored split (both documents of a paired split).

  Loaders that already keep only ``max_length`` tokens (text, retrieval) report at load
  time; their stored lengths are then within ``max_length`` and nothing is printed here.

  Returns:
    The messages printed (empty when nothing is cut).
  """
  parts = ([(f"{name} (first documents)", examples.first),
            (f"{name} (second documents)", examples.second)]
           if isinstance(examples, PairedExamples) else [(name, examples)])
  messages = [report_truncation(part, split.lengths, max_length) for part, split in parts]
  return [m for m in messages if m]


def split_train_val(n: int, val_fraction: float, seed: int,
                    lra_split: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """Indices of the train and validation parts of ``n`` training examples (image, text).

  Args:
    n: number of training examples.
    val_fraction: ``data.val_fraction``, in (0, 1). The validation part has
      ``round(n * val_fraction)`` examples.
    seed: seeds the permutation.
    lra_split: take the last ``val_fraction`` in source order (LRA's
      ``train[90%:]``) instead of a seeded draw.

  Returns:
    ``(train_idx, val_idx)``: sorted int64 arrays, disjoint, covering
    ``range(n)``.

  Raises:
    ValueError: if ``val_fraction`` is not in (0, 1).
  """
  if not 0.0 < float(val_fraction) < 1.0:
    raise ValueError(f"data.val_fraction must lie in (0, 1), got {val_fraction!r}")
  n_val = int(round(n * float(val_fraction)))
  if lra_split:
    return np.arange(n - n_val, dtype=np.int64), np.arange(n - n_val, n, dtype=np.int64)
  perm = np.random.default_rng(seed).permutation(n)
  return np.sort(perm[n_val:]).astype(np.int64), np.sort(perm[:n_val]).astype(np.int64)
