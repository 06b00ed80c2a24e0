"""Weight surgery: copy trained parameters into a model with another attention, matched by
``/``-joined path (e.g. ``encoder/encoderblock_0/attention/query/kernel``), and freeze subsets.
For the SimpleTRON paper's section 4.2 (a Simple model's q/k/v, frozen, in a softmax model) and
Chan & Ong's attention swaps (``model.attention_per_layer``, then LoRA or full retraining)."""

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
    new: kept at the target's initialisation.
    dropped: in the source but not used.
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
  """Copies ``source`` parameters into ``target`` where a path is in both: ``(params, report)``.

  Args:
    source: a trained parameter tree.
    target: the new model's initialised tree; ``params`` has its structure and dtypes.
    include: regexes (``re.search``) of the paths to copy; empty: every shared path.

  Raises:
    ValueError: for included shared paths whose shapes differ, or an unmatched ``include``.
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
  """:func:`transfer_params` (same errors) into ``params``, or a LoRA tree's ``base``."""
  include = tuple(include)
  if lora.is_wrapped(params):
    base, report = transfer_params(source, params[lora.BASE], include)
    return {**params, lora.BASE: base}, report
  return transfer_params(source, params, include)


def freeze_labels(params, patterns: Sequence[str]) -> Any:
  """``params``' tree of labels: ``"frozen"`` where the path matches a pattern, else ``"trained"``.

  Raises:
    ValueError: if a pattern (config field ``freeze``) matches no parameter.
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
  """``tx`` on the parameters not matching ``patterns``; the rest get zero updates (weight decay
  included), and gradient clipping inside ``tx`` sees only the trained ones."""
  patterns = tuple(patterns)
  return optax.multi_transform({TRAINED: tx, FROZEN: optax.set_to_zero()},
                               lambda params: freeze_labels(params, patterns))
