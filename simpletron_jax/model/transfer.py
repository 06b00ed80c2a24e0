"""Weight surgery: move trained parameters into a model with another attention, and freeze
parameter subsets.

The experiments it serves:

* SimpleTRON (Yorsh et al.), section 4.2: the q/k/v projections of a trained Simple model
  go into a softmax Transformer, where they stay frozen while the rest trains.
* Chan & Ong's linear-attention study: the attention of a trained softmax model is swapped
  (all layers, the first k or the last k, via ``model.attention_per_layer``) for linear
  attention without retraining, then re-aligned with LoRA (:mod:`simpletron_jax.model.lora`) or
  retrained in full.

Every attention variant names its projections ``query``/``key``/``value``/``out``
(``attention/base.py``), so parameters are matched by their ``/``-joined path, e.g.
``encoder/encoderblock_0/attention/query/kernel``, and copied where the shapes agree.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence

import numpy as np
import optax
from flax import traverse_util

from simpletron_jax.model import lora

FROZEN, TRAINED = "frozen", "trained"


def flatten(params) -> dict[str, Any]:
  """``{"a/b/kernel": array}`` from a nested parameter tree."""
  return traverse_util.flatten_dict(params, sep="/")


@dataclasses.dataclass
class SurgeryReport:
  """What :func:`transfer_params` did, as sorted lists of parameter paths.

  Attributes:
    copied: taken from the source (same path and shape).
    new: kept at the target's initialisation (absent from the source, or not included).
    dropped: in the source but not used (absent from the target, or not included).
  """

  copied: list[str]
  new: list[str]
  dropped: list[str]

  def to_dict(self) -> dict[str, list[str]]:
    """The report as a JSON-ready dict."""
    return dataclasses.asdict(self)

  def summary(self) -> str:
    """One line of counts, e.g. ``copied 12, new 2, dropped 1``."""
    return f"copied {len(self.copied)}, new {len(self.new)}, dropped {len(self.dropped)}"


def _matches(path: str, patterns: Sequence[str]) -> bool:
  return any(re.search(p, path) for p in patterns)


def transfer_params(source, target, include: Sequence[str] = ()) -> tuple[Any, SurgeryReport]:
  """Copies ``source`` parameters into ``target`` wherever the path exists in both.

  Args:
    source: a trained parameter tree.
    target: the freshly initialised tree of the new model (its structure is kept).
    include: regexes (``re.search`` on the path); when given, only matching shared paths
      are copied (e.g. ``("attention/(query|key|value)/",)`` for SimpleTRON's q/k/v
      transfer). Empty: every shared path.

  Returns:
    ``(params, report)``: ``params`` has ``target``'s structure and dtypes.

  Raises:
    ValueError: naming every shared, included path whose source and target shapes differ,
      or an ``include`` pattern (config field ``init_include``) that matches no shared path.
  """
  src, tgt = flatten(source), flatten(target)
  shared = sorted(set(src) & set(tgt))
  for pattern in include:
    if not any(re.search(pattern, p) for p in shared):
      raise ValueError(f"init_include pattern {pattern!r} matches no parameter shared by "
                       f"source and target; shared paths: {shared}")
  chosen = [p for p in shared if not include or _matches(p, include)]
  bad = [f"{p}: source {tuple(np.shape(src[p]))} vs target {tuple(np.shape(tgt[p]))}"
         for p in chosen if np.shape(src[p]) != np.shape(tgt[p])]
  if bad:
    raise ValueError("parameter shapes differ (restrict the copy with init_include): "
                     + "; ".join(bad))
  out = dict(tgt)
  for p in chosen:
    out[p] = np.asarray(src[p]).astype(np.asarray(tgt[p]).dtype)
  report = SurgeryReport(copied=chosen, new=sorted(set(tgt) - set(chosen)),
                         dropped=sorted(set(src) - set(chosen)))
  return traverse_util.unflatten_dict(out, sep="/"), report


def init_from_params(params, source, include: Sequence[str] = ()) -> tuple[Any, SurgeryReport]:
  """Copies ``source`` (``init_from``'s parameters) into freshly initialised params,
  restricted by ``include`` (the config field ``init_include``).

  Args:
    params: the new model's parameters, possibly a LoRA ``{"base", "lora"}`` tree (the
      surgery then goes into ``base``).
    source: the parameter tree to copy from
      (:func:`simpletron_jax.train.params_checkpoints.load_params`).
    include: regexes of the parameter paths to copy; empty: every match.

  Returns:
    ``(params, report)``.

  Raises:
    ValueError: see :func:`transfer_params`.
  """
  include = tuple(include)
  if lora.is_wrapped(params):
    base, report = transfer_params(source, params[lora.BASE], include)
    return {**params, lora.BASE: base}, report
  return transfer_params(source, params, include)


def freeze_labels(params, patterns: Sequence[str]) -> Any:
  """A tree like ``params`` with ``"frozen"`` where the path matches a pattern, else
  ``"trained"``.

  Raises:
    ValueError: if a pattern (config field ``freeze``) matches no parameter; the message
      lists the paths there are.
  """
  flat = flatten(params)
  for pattern in patterns:
    if not any(re.search(pattern, p) for p in flat):
      raise ValueError(f"freeze pattern {pattern!r} matches no parameter; paths: "
                       f"{sorted(flat)}")
  labels = {p: FROZEN if _matches(p, patterns) else TRAINED for p in flat}
  return traverse_util.unflatten_dict(labels, sep="/")


def freeze(tx: optax.GradientTransformation,
           patterns: Sequence[str]) -> optax.GradientTransformation:
  """``tx`` on the parameters not matching ``patterns``; zero updates for the rest.

  Frozen parameters stay bit-identical (``optax.set_to_zero``), weight decay included, and
  gradient clipping inside ``tx`` sees only the trained ones.
  """
  patterns = tuple(patterns)
  return optax.multi_transform({TRAINED: tx, FROZEN: optax.set_to_zero()},
                               lambda params: freeze_labels(params, patterns))
