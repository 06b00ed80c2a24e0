"""LRA's ListOps expression trees: the reference algorithm, a fast sampler and their printers.

LRA's generator (``lra_benchmarks/data/listops.py``) draws a tree with ``generate_tree`` and
writes it with ``to_string``. :func:`generate_tree` and :func:`to_string` are that algorithm as
written (nested tuples); :func:`sample_token_ids` makes the same draws, in the same order, from
a :class:`random.Random` and returns the paren-free token ids of the same tree with no tuples,
and :func:`to_source` writes those ids as the same ``Source`` string. The data generator
(:mod:`simpletron_jax.data.listops.generate`) uses the fast pair; the tests check that the two
agree. Ids are those of :data:`simpletron_jax.data.listops.tokens.VOCAB`.
"""

from __future__ import annotations

import random
from typing import Any, Sequence

import numpy as np

from simpletron_jax.data.listops.tokens import _END_ID, _MIN_ID, _SM_ID, END, OPERATORS, VOCAB

_LEAF_P = 0.25  # LRA's VALUE_P: a node is a leaf when random() > 0.25.


# ----------------------------------------------------------------------------
# Generation: the reference tree algorithm (LRA's, verbatim in behaviour).


def generate_tree(rng: random.Random, depth: int = 1, max_depth: int = 10,
                  max_args: int = 10) -> tuple[Any, int]:
  """Draws one expression tree with LRA's ``generate_tree`` algorithm.

  This is the readable reference version. :func:`sample_token_ids` makes the
  same tree from the same ``rng`` state, faster and with no tuples; the data
  generator uses that one. Both make the same calls on ``rng``, in the same
  order, as LRA's code:

  * ``rng.random()`` only when ``depth < max_depth``. The node is a leaf when
    the draw is ``> 0.25``, and always a leaf at ``max_depth``.
  * A leaf draws ``rng.choice(range(10))``.
  * An operator draws ``rng.randint(2, max_args)`` for its number of children,
    then draws its children in order, then ``rng.choice(OPERATORS)``.

  Args:
    rng: the random source.
    depth: depth of this node. The root has depth 1.
    max_depth: nodes at this depth are leaves.
    max_args: the most children an operator can have.

  Returns:
    ``(tree, length)``. A leaf is an int. An operator node with children
    ``c1..ck`` is the left-nested pairs ``((((op, c1), c2), ..., ck), "]")``.
    ``length`` counts digits, operators and ``]`` in tokens, not parentheses.
    It is computed for the whole tree, so the recursion here is at most
    ``max_depth`` deep.
  """
  r = rng.random() if depth < max_depth else 1.0
  if r > _LEAF_P:
    return rng.choice(range(10)), 1
  length = 2
  children = []
  for _ in range(rng.randint(2, max_args)):
    child, child_length = generate_tree(rng, depth + 1, max_depth, max_args)
    children.append(child)
    length += child_length
  tree: Any = (rng.choice(OPERATORS), children[0])
  for child in children[1:]:
    tree = (tree, child)
  return (tree, END), length


def to_string(tree: Any) -> str:
  """Writes a tree from :func:`generate_tree` in LRA's ``Source`` form.

  A pair ``(x, y)`` is written ``( x y )``, a digit as itself and a string
  (operator or ``]``) as itself. For example ``[MAX 2 9 ]`` is written
  ``( ( ( [MAX 2 ) 9 ) ] )``. This uses an explicit stack, so deep trees work.

  Args:
    tree: an int, a str or a nested 2-tuple.

  Returns:
    The space-separated string.

  Raises:
    TypeError: on a node that is not an int, str or 2-tuple.
  """
  parts: list[str] = []
  todo: list[Any] = [tree]  # nodes to write, last first; ")" marks a pair's close
  while todo:
    node = todo.pop()
    if isinstance(node, tuple) and len(node) == 2:
      parts.append("(")
      todo.extend((")", node[1], node[0]))
    elif isinstance(node, (int, np.integer)) and not isinstance(node, bool):
      parts.append(str(int(node)))
    elif isinstance(node, str):
      parts.append(node)
    else:
      raise TypeError(f"not a ListOps tree node: {node!r}")
  return " ".join(parts)


# ----------------------------------------------------------------------------
# Generation: the fast flat version used to build the data.


def sample_token_ids(rng: random.Random, max_depth: int = 10, max_args: int = 10) -> list[int]:
  """Draws one expression with LRA's algorithm, as paren-free token ids.

  The output is the token sequence of the tree that
  ``generate_tree(rng, 1, max_depth, max_args)`` would draw from the same
  ``rng`` state. The draws are the same, in the same order, and ``rng`` ends
  in the same state. The difference is that this version walks the tree with
  an explicit stack and builds no tuples. Each choice draws
  ``rng.getrandbits`` and rejects values that are out of range. That is how
  CPython's ``choice``/``randint`` work. The tests check that the two versions
  agree.

  Args:
    rng: the random source.
    max_depth: nodes at this depth are leaves. The root has depth 1.
    max_args: the most children an operator can have (at least 2).

  Returns:
    List of ids in prefix order (operator, its children, then ``]``), with
    ``len`` = the LRA length in tokens.
  """
  rand = rng.random
  bits = rng.getrandbits
  n_arg_choices = max_args - 1  # randint(2, max_args) = 2 + randbelow(max_args - 1)
  arg_bits = n_arg_choices.bit_length()
  ids: list[int] = []
  remaining: list[int] = []  # children still to draw, per open operator
  op_pos: list[int] = []  # where each open operator's id goes
  depth = 1
  while True:
    if depth < max_depth and rand() <= _LEAF_P:
      k = bits(arg_bits)
      while k >= n_arg_choices:
        k = bits(arg_bits)
      op_pos.append(len(ids))
      ids.append(0)  # Placeholder: LRA draws the operator after the children.
      remaining.append(k + 2)
      depth += 1
      continue
    d = bits(4)  # choice(range(10))
    while d >= 10:
      d = bits(4)
    ids.append(d + 1)
    # Close every operator whose last child this was.
    while remaining:
      remaining[-1] -= 1
      if remaining[-1]:
        break
      remaining.pop()
      o = bits(3)  # choice(OPERATORS), 4 = 0b100 has bit_length 3
      while o >= 4:
        o = bits(3)
      ids[op_pos.pop()] = _MIN_ID + o
      ids.append(_END_ID)
      depth -= 1
    else:
      return ids


def to_source(ids: Sequence[int]) -> str:
  """Writes paren-free token ids in LRA's parenthesised ``Source`` form.

  ``to_source(sample_token_ids(rng))`` equals ``to_string(tree)`` for the tree
  that :func:`generate_tree` draws from the same ``rng`` state. An operator
  with ``k`` children is written as ``k + 1`` opening parentheses, the
  operator, each child followed by ``)``, and then ``] )``.

  Args:
    ids: a well-formed expression as ids from :data:`VOCAB`, e.g. the output
      of :func:`sample_token_ids` or :func:`tokenize`.

  Returns:
    The ``Source`` string.

  Raises:
    ValueError: on an unbalanced ``]`` or an unknown id.
  """
  parts: list[str] = []
  open_ops: list[list[int]] = []  # [index in parts, children so far]
  for t in ids:
    if _MIN_ID <= t <= _SM_ID:
      open_ops.append([len(parts), 0])
      parts.append(VOCAB[t])
      continue
    if t == _END_ID:
      if not open_ops:
        raise ValueError("unbalanced ']'")
      at, n_children = open_ops.pop()
      parts[at] = "( " * (n_children + 1) + parts[at]
      parts.append("] )")
    elif 1 <= t <= 10:
      parts.append(VOCAB[t])
    else:
      raise ValueError(f"unknown token id {t}")
    if open_ops:
      open_ops[-1][1] += 1
      parts.append(")")
  return " ".join(parts)


def _max_tree_length(max_depth: int, max_args: int) -> int:
  """The largest possible length in tokens, capped at 2**62."""
  length = 1
  for _ in range(max(max_depth - 1, 0)):
    length = min(2 + max_args * length, 2**62)
  return length
