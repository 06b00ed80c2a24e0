"""The ListOps language: its fixed vocabulary, LRA's tokenisation and the label evaluator.

The task follows LRA's ``lra_benchmarks/data/listops.py`` (generator) and
``lra_benchmarks/listops/input_pipeline.py`` (tokenisation).

An expression is a tree. Each inner node is one of the operators ``[MIN``,
``[MAX``, ``[MED`` (median) and ``[SM`` (sum modulo 10), is closed by ``]``,
and has 2 to ``max_args`` children. Each leaf is a digit 0-9. The label is the
value of the tree, a class in 0..9.

In LRA's ``Source`` form the tree is written as left-nested pairs. An operator
with children ``c1 .. ck`` becomes ``((((op, c1), c2), ...), ck), ])``, and
every pair is written ``( X Y )``. So ``[MAX 2 9 ]`` is stored as
``( ( ( [MAX 2 ) 9 ) ] )``.

LRA's pipeline removes the parentheses and splits on whitespace. The length of
an example is the number of tokens left: digits, operators and ``]``.

LRA built its vocabulary from a Python ``set()``, so the token ids changed from
run to run. Here the vocabulary is the fixed tuple :data:`VOCAB`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


# ----------------------------------------------------------------------------
# Vocabulary.

VOCAB: tuple[str, ...] = (
    "<pad>", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9",
    "[MIN", "[MAX", "[MED", "[SM", "]")
"""Token strings by id. Id 0 is padding; digit ``d`` has id ``d + 1``."""
VOCAB_SIZE = 16
PAD_ID = 0
NUM_CLASSES = 10
OPERATORS: tuple[str, ...] = ("[MIN", "[MAX", "[MED", "[SM")
"""The operators in LRA's order. The generator picks one by index in this tuple."""
END = "]"

_MIN_ID, _MAX_ID, _MED_ID, _SM_ID = (VOCAB.index(op) for op in OPERATORS)
_END_ID = VOCAB.index(END)
_TOKEN_ID = {tok: i for i, tok in enumerate(VOCAB) if i != PAD_ID}
_BYTES_TOKEN_ID = {tok.encode(): i for tok, i in _TOKEN_ID.items()}

assert len(VOCAB) == VOCAB_SIZE and _END_ID == VOCAB_SIZE - 1

# ----------------------------------------------------------------------------
# Tokenisation and labels.


def _split_tokens(source: str) -> list[str]:
  """Removes ``(`` and ``)`` wherever they occur and splits on whitespace (as LRA does)."""
  return source.replace("(", "").replace(")", "").split()


def tokenize(source: str) -> np.ndarray:
  """Turns a ``Source`` string into token ids.

  As LRA's input pipeline does, this removes every ``(`` and ``)`` and splits
  on whitespace. Then it maps each token through the fixed :data:`VOCAB`.

  Args:
    source: an expression, with or without LRA's parentheses.

  Returns:
    ``[L]`` int32 array of ids in ``1..VOCAB_SIZE - 1``. ``L`` is the number
    of digits, operators and ``]`` (in tokens). Padding id 0 never occurs.

  Raises:
    ValueError: if a token is not in the vocabulary. The message names the
      token.
  """
  tokens = _split_tokens(source)
  try:
    return np.fromiter(map(_TOKEN_ID.__getitem__, tokens), dtype=np.int32, count=len(tokens))
  except KeyError as e:
    raise ValueError(f"unknown ListOps token {e.args[0]!r}; the tokens are "
                     f"{', '.join(VOCAB[1:])}") from None


def _apply(op_id: int, args: list[int]) -> int:
  """The value of one operator applied to its list of argument values."""
  if op_id == _MIN_ID:
    return min(args)
  if op_id == _MAX_ID:
    return max(args)
  if op_id == _SM_ID:
    return sum(args) % 10
  # Median: int(np.median(args)). For an even count, numpy takes the mean of
  # the two middle values and int() truncates it.
  ordered = sorted(args)
  mid = len(ordered) // 2
  if len(ordered) % 2:
    return ordered[mid]
  return int((ordered[mid - 1] + ordered[mid]) / 2)


def _evaluate_ids(ids: Sequence[int]) -> int:
  """The value of an expression given as paren-free token ids.

  This uses an explicit stack, so the nesting depth is unlimited.

  Raises:
    ValueError: if the expression is malformed.
  """
  stack: list[tuple[int, list[int]]] = []  # (operator id, argument values so far)
  n = len(ids)
  for pos, t in enumerate(ids):
    if 1 <= t <= 10:
      value = t - 1
    elif _MIN_ID <= t <= _SM_ID:
      stack.append((t, []))
      continue
    elif t == _END_ID:
      if not stack:
        raise ValueError(f"unbalanced ']' at token {pos}: no operator is open")
      op_id, args = stack.pop()
      if not args:
        raise ValueError(f"operator {VOCAB[op_id]} closed at token {pos} has no arguments")
      value = _apply(op_id, args)
    else:
      raise ValueError(f"unknown token id {t} at token {pos}")
    if stack:
      stack[-1][1].append(value)
    elif pos != n - 1:
      raise ValueError(f"trailing tokens after the complete expression, from token {pos + 1} "
                       f"of {n}")
    else:
      return value
  if stack:
    raise ValueError(f"{len(stack)} operator(s) not closed by ']' at the end of the expression "
                     f"(innermost: {VOCAB[stack[-1][0]]})")
  raise ValueError("empty expression")


def evaluate(source: str) -> int:
  """The label of a ListOps expression.

  Accepts LRA's ``Source`` form (``( ( ( [MAX 2 ) 9 ) ] )``) and the same text
  without parentheses (``[MAX 2 9 ]``). The operators follow LRA's
  ``to_value``: ``[MIN`` is min, ``[MAX`` is max, ``[MED`` is
  ``int(numpy.median(args))`` (for an even count, the mean of the two middle
  values, truncated), and ``[SM`` is ``sum(args) % 10``.

  An explicit stack is used, not recursion, so any nesting depth works.

  Args:
    source: the expression.

  Returns:
    The value, an int in 0..9.

  Raises:
    ValueError: if the expression is malformed. That covers an unknown token,
      an unbalanced ``]``, an operator with no arguments, an operator that is
      never closed, tokens after the complete expression, and an empty
      expression.
  """
  return _evaluate_ids(tokenize(source).tolist())
