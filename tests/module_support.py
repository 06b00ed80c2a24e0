"""Parameters and jitted calls for the tests of flax modules, with few compiles.

Compiling is most of the suite's time (docs/testing.md). An eager ``module.init`` or
``module.apply`` compiles each operation at each new shape (20 to 30 ms with its lowering),
and ``jax.jit(module.init)`` compiles the random draws of every parameter into the model's
own program, which takes as long as compiling a train step. So the tests take parameters
from ``init_variables`` and call a module through ``jit_apply``.
"""

import functools

import jax
from jax.extend import core as jex_core


def init_variables(module, *args, seed: int = 1, **kwargs):
  """``module.init(jax.random.PRNGKey(seed), *args, **kwargs)``'s variables, the same values.

  The init is traced (``jax.make_jaxpr``, no compile) and only the equations that the
  variables depend on are evaluated, as ``jax.core.eval_jaxpr`` does: the initialisers'
  random draws, jitted functions compiled once per shape and shared by every test of the
  process. An eager ``module.init`` also runs every operation of the call; ``lazy_init``
  still compiles a program per jitted ``jnp`` function of the call.

  Args: ``module``, a flax module; ``args`` and ``kwargs``, what ``module.init`` takes
  after its key (arrays of any shape and dtype the module accepts).
  Returns: the variables dict (``{"params": ...}`` and any other collections), the pytree
  ``module.init`` returns, with its shapes and dtypes.
  """
  key = jax.random.PRNGKey(seed)
  init = functools.partial(module.init, **kwargs)
  closed, shapes = jax.make_jaxpr(init, return_shape=True)(key, *args)
  jaxpr = closed.jaxpr
  is_var = lambda v: not isinstance(v, jex_core.Literal)  # noqa: E731
  needed, eqns = {v for v in jaxpr.outvars if is_var(v)}, []
  for eqn in reversed(jaxpr.eqns):  # the equations the variables depend on
    if any(v in needed for v in eqn.outvars):
      eqns.append(eqn)
      needed.update(filter(is_var, eqn.invars))
  pruned = closed.replace(jaxpr=jaxpr.replace(eqns=eqns[::-1]))
  leaves = jex_core.jaxpr_as_fun(pruned)(*jax.tree.leaves((key, *args)))
  return jax.tree.unflatten(jax.tree.structure(shapes), leaves)


@functools.cache
def jit_apply(module, sown: bool = False):
  """``module.apply`` as one jitted program (``sown``: with the ``intermediates``
  collection mutable, returning ``(outputs, {"intermediates": ...})``), shared by the tests
  that call an equal module: one trace and one compile per shape in a process."""
  if sown:
    return jax.jit(lambda params, *args: module.apply(params, *args, mutable=["intermediates"]))
  return jax.jit(module.apply)
