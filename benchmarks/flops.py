"""Analytic FLOP count of a JAX function: the sum of its matrix products.

XLA's ``compiled.cost_analysis()`` leaves out library calls (cuBLAS GEMMs, cuDNN attention),
so on a GPU it counted about a tenth of a train step's FLOPs (issue 10). Here the count comes
from the function's jaxpr instead, before XLA sees it:

* ``dot_general``: ``2 * prod(batch) * prod(lhs free) * prod(rhs free) * prod(contracted)``,
  i.e. 2 FLOPs (multiply and add) per multiply-accumulate;
* cuDNN fused attention (``dot_product_attention_fwd`` / ``_bwd``, ``B, T, S, N, H`` =
  batch, query length, key length, heads, head dim): forward ``4 B N T S H`` (``Q K^T`` and
  ``P V``), backward ``10 B N T S H`` (``Q K^T`` recomputed, ``dP = dO V^T``, ``dV``,
  ``dQ``, ``dK``), as FlashAttention-2 counts them;
* sub-jaxprs are walked: ``pjit``, ``xla_pmap`` (per-device shapes), custom JVP/VJP calls,
  ``remat``, ``scan`` (times its length), ``cond`` (the costliest branch) and ``while``
  (the body once; its trip count is unknown, reported in ``while_loops``).

Elementwise work, reductions, softmax and the optimizer are not counted: matrix products
are what the "share of the matmul peak" compares against.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
from jax.extend import core as jex_core

ATTENTION_FWD = ("dot_product_attention_fwd",)
ATTENTION_BWD = ("dot_product_attention_bwd",)


@dataclasses.dataclass
class FlopCount:
  """FLOPs of one call, split by source.

  Attributes:
    dot_general: FLOPs of ``dot_general`` ops (einsum, matmul, Dense).
    fused_attention: FLOPs of cuDNN attention custom calls.
    while_loops: number of ``while`` bodies counted once.
  """

  dot_general: float = 0.0
  fused_attention: float = 0.0
  while_loops: int = 0

  @property
  def total(self) -> float:
    """All counted FLOPs."""
    return self.dot_general + self.fused_attention

  def add(self, other: "FlopCount", times: float = 1.0) -> None:
    """Adds ``times`` copies of ``other`` in place."""
    self.dot_general += times * other.dot_general
    self.fused_attention += times * other.fused_attention
    self.while_loops += other.while_loops


def dot_general_flops(lhs_shape, rhs_shape, dimension_numbers) -> float:
  """``2 * prod(lhs_shape) * prod(rhs dims that are neither contracted nor batch)``.

  Args:
    lhs_shape, rhs_shape: operand shapes.
    dimension_numbers: ``((lhs_contract, rhs_contract), (lhs_batch, rhs_batch))`` as in
      ``jax.lax.dot_general``.

  Returns:
    FLOPs, counting a multiply-add as 2.
  """
  (_, rhs_contract), (_, rhs_batch) = dimension_numbers
  rhs_free = [d for i, d in enumerate(rhs_shape) if i not in rhs_contract and i not in rhs_batch]
  return 2.0 * math.prod(lhs_shape) * math.prod(rhs_free)


def _attention_flops(eqn, backward: bool) -> float:
  b, t, n, h = eqn.invars[0].aval.shape      # query, BTNH
  s = eqn.invars[1].aval.shape[1]            # key, BSNH
  return (10.0 if backward else 4.0) * b * n * t * s * h


def _sub_jaxprs(value) -> list:
  if isinstance(value, jex_core.ClosedJaxpr):
    return [value.jaxpr]
  if isinstance(value, jex_core.Jaxpr):
    return [value]
  if isinstance(value, (tuple, list)):
    return [j for v in value for j in _sub_jaxprs(v)]
  return []


def jaxpr_flops(jaxpr) -> FlopCount:
  """The :class:`FlopCount` of a (closed) jaxpr, walking its sub-jaxprs (module docstring)."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  count = FlopCount()
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      count.dot_general += dot_general_flops(eqn.invars[0].aval.shape,
                                             eqn.invars[1].aval.shape,
                                             eqn.params["dimension_numbers"])
    elif name in ATTENTION_FWD or name in ATTENTION_BWD:
      count.fused_attention += _attention_flops(eqn, name in ATTENTION_BWD)
    elif name == "cond":
      branches = [jaxpr_flops(j) for j in _sub_jaxprs(eqn.params["branches"])]
      count.add(max(branches, key=lambda c: c.total))
    elif name == "scan":
      count.add(jaxpr_flops(eqn.params["jaxpr"]), times=eqn.params["length"])
    else:
      if name == "while":
        count.while_loops += 1
      for value in eqn.params.values():
        for sub in _sub_jaxprs(value):
          count.add(jaxpr_flops(sub))
  return count


def function_flops(fn: Callable, *args: Any, **kwargs: Any) -> FlopCount:
  """The :class:`FlopCount` of one call ``fn(*args, **kwargs)``, traced abstractly.

  For a ``jax.pmap``ped ``fn`` the count is per device.
  """
  return jaxpr_flops(jax.make_jaxpr(fn)(*args, **kwargs))
