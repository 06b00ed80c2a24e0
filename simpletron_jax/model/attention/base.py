"""Pieces shared by the attention modules: projections, initialisers and masks.

All attention modules in this package share one call::

    y_BxLxO = Attention(num_heads=H, qkv_dim=D, out_dim=O, ...)(x_BxLxE, mask_BxL,
                                                                deterministic=True)

``mask_BxL`` is bool with True for a real token. The initialisers follow LRA
``models/transformer/transformer.py``: Xavier-uniform kernels and normal(1e-6)
biases. Under ``model.dense_init="torch"`` (the SimpleTRON authors' ``nn.Linear`` layers,
``lra/notebooks/listops_setup_simple_2.ipynb``) the projections made here take torch's
defaults instead. Every variant subclasses :class:`Attention`, which declares the fields the
encoder block sets (``AttentionSpec.build``) and makes the projections with them.
:func:`compiling_for` / :func:`target_platform` tell modules which platform a trace is for.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp

KERNEL_INIT = nn.initializers.xavier_uniform()
BIAS_INIT = nn.initializers.normal(stddev=1e-6)
# Dense-layer init schemes (config field model.dense_init): LRA's (above) or torch nn.Linear's.
INITS = ("lra", "torch")
# torch ``nn.Linear.reset_parameters``: kaiming_uniform(a=sqrt(5)) on the weight, i.e.
# U(+-gain * sqrt(3 / fan_in)) with gain sqrt(2 / (1 + 5)), which is U(+-1 / sqrt(fan_in)):
# variance 1 / (3 fan_in).
TORCH_KERNEL_INIT = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")

Dtype = Any
Initializer = Callable[..., jnp.ndarray]

# Platforms a module may be compiled for (jax.default_backend()'s names).
PLATFORMS = ("cpu", "gpu", "tpu")
_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("target_platform",
                                                                     default=None)


def target_platform() -> str:
  """The platform the modules traced now are compiled for.

  Modules that choose a kernel at trace time (``SoftmaxAttention``'s ``flash``: cuDNN on a
  GPU, the Pallas TPU kernel on a TPU) read this rather than ``jax.default_backend()``, so
  that a step lowered on a CPU host for TPU devices (``scripts/tpu_check.py``) picks the
  TPU's kernels.

  Returns:
    The platform set by the innermost :func:`compiling_for` block of this thread's context,
    else ``jax.default_backend()`` (``"cpu"``, ``"gpu"`` or ``"tpu"``).
  """
  override = _TARGET.get()
  return jax.default_backend() if override is None else override


@contextlib.contextmanager
def compiling_for(platform: str) -> Iterator[None]:
  """Makes :func:`target_platform` return ``platform`` while the block runs.

  Wrap the tracing (``jax.jit(f).lower(...)``, ``Module.init``/``apply`` under a trace),
  not the later ``.compile()``: kernels are chosen when the module is traced. The setting is
  a ``contextvars.ContextVar``, so it holds in this thread (and asyncio task) only; threads
  started inside the block do not see it. Running a program traced for another platform
  on this one fails when it is lowered (e.g. a Pallas TPU kernel on a CPU) unless that kernel
  runs in Pallas's interpret mode (``jax.experimental.pallas.tpu.force_tpu_interpret_mode``,
  used by the tests).

  Args:
    platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``.

  Raises:
    ValueError: for another platform name.
  """
  if platform not in PLATFORMS:
    raise ValueError(f"compiling_for({platform!r}): expected one of {list(PLATFORMS)}")
  token = _TARGET.set(platform)
  try:
    yield
  finally:
    _TARGET.reset(token)


def torch_bias_init(fan_in: int) -> Initializer:
  """torch ``nn.Linear``'s bias init, ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``.

  Args:
    fan_in: the layer's input width (torch's ``in_features``).

  Returns:
    A flax initialiser ``(key, shape, dtype=float32) -> array``.
  """
  bound = 1.0 / float(fan_in) ** 0.5

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return init


def initializers(fan_in: int, init: str) -> tuple[Initializer, Initializer]:
  """The ``(kernel_init, bias_init)`` of a Dense layer with input width ``fan_in``.

  Args:
    fan_in: input width (the flat width for a ``DenseGeneral`` over several axes).
    init: ``"lra"`` (Xavier-uniform kernel, normal(1e-6) bias: LRA's block layers) or
      ``"torch"`` (kernel and bias ``U(+-1/sqrt(fan_in))``: torch ``nn.Linear``, the
      SimpleTRON authors' code; ``model.dense_init``).

  Returns:
    Two flax initialisers. Kernels are drawn on the flat ``[fan_in, out]`` shape.

  Raises:
    ValueError: naming ``model.dense_init`` for an unknown scheme.
  """
  if init not in INITS:
    raise ValueError(f"model.dense_init={init!r}; expected one of {list(INITS)}")
  if init == "torch":
    return TORCH_KERNEL_INIT, torch_bias_init(fan_in)
  return KERNEL_INIT, BIAS_INIT


def check_head_dims(qkv_dim: int, num_heads: int) -> int:
  """Returns the per-head width ``qkv_dim // num_heads``.

  Raises:
    ValueError: if ``qkv_dim`` is not a positive multiple of ``num_heads``;
      the message names the config fields ``model.qkv_dim`` and
      ``model.num_heads``.
  """
  if num_heads <= 0 or qkv_dim <= 0 or qkv_dim % num_heads:
    raise ValueError(
        f"model.qkv_dim={qkv_dim} must be a positive multiple of "
        f"model.num_heads={num_heads}")
  return qkv_dim // num_heads


def project_qkv(x_BxLxE: jnp.ndarray, num_heads: int, qkv_dim: int, dtype: Dtype,
                flat: bool = False, *, use_bias: bool = True, dense_init: str
                ) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
  """Projects the input to per-head queries, keys and values.

  Must be called inside a compact module method: it creates the submodules
  ``query``, ``key`` and ``value`` (``DenseGeneral`` to ``(H, D/H)``, with a bias when
  ``use_bias``), so checkpoints of every variant share these parameter names.

  Args:
    x_BxLxE: ``[B, L, E]`` float input.
    num_heads: H.
    qkv_dim: D, the total query/key/value width over all heads.
    dtype: computation dtype.
    flat: see :func:`head_projection`.
    use_bias: see :func:`head_projection`.
    dense_init: see :func:`head_projection`.

  Returns:
    ``(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK)`` with ``K = D // H``.
  """
  return tuple(head_projection(x_BxLxE, num_heads, qkv_dim, dtype, name, flat,
                               use_bias=use_bias, dense_init=dense_init)
               for name in ("query", "key", "value"))


def head_projection(x_BxLxE: jnp.ndarray, num_heads: int, qkv_dim: int, dtype: Dtype,
                    name: str, flat: bool = False, *, use_bias: bool = True,
                    dense_init: str) -> jnp.ndarray:
  """One per-head projection (``DenseGeneral`` to ``(H, D/H)``) named ``name``.

  For variants that need only some of ``query``/``key``/``value`` (Reformer's shared QK,
  the Synthesizer's values); call it inside a compact module method.

  Args:
    x_BxLxE: ``[B, L, E]`` float input.
    num_heads: H.
    qkv_dim: D, the total width over all heads.
    dtype: computation dtype.
    name: the submodule name, e.g. ``"value"``.
    flat: compute it as :class:`HeadProjection` (the same parameters and function, one
      flat matmul and bias; not bit-identical).
    use_bias: add a learned bias. LRA's attentions have none (``bias=False`` in
      ``models/transformer/transformer.py`` and every variant built like it; config field
      ``model.attention_bias``, default False); the SimpleTRON authors' ``nn.Linear`` layers
      have one.
    dense_init: the kernel and bias initialisers, :func:`initializers` of this scheme
      (``"lra"`` or ``"torch"``; ``model.dense_init``).

  Returns:
    ``[B, L, H, D // H]``.

  Raises:
    ValueError: see :func:`check_head_dims` and :func:`initializers`.
  """
  head_dim = check_head_dims(qkv_dim, num_heads)
  if flat:
    return HeadProjection(num_heads, head_dim, dtype, use_bias, dense_init,
                          name=name)(x_BxLxE)
  kernel_init, bias_init = initializers(x_BxLxE.shape[-1], dense_init)
  return nn.DenseGeneral(features=(num_heads, head_dim), kernel_init=kernel_init,
                         bias_init=bias_init, use_bias=use_bias, dtype=dtype,
                         name=name)(x_BxLxE)


class HeadProjection(nn.Module):
  """``nn.DenseGeneral(features=(H, K))`` with its parameters, computed as one flat matmul.

  The parameters are DenseGeneral's: ``kernel`` ``[E, H, K]`` and ``bias`` ``[H, K]``,
  float32, initialised as DenseGeneral does (on the flat ``[E, H*K]`` and ``[H*K]`` shapes,
  then reshaped, with :func:`initializers` of ``dense_init``),
  so checkpoints and initial values are unchanged. The product is taken
  with the kernel as ``[E, H*K]`` and the bias added as ``[H*K]``, then split into heads.
  DenseGeneral adds its ``[H, K]`` bias over the 4-D result, which XLA's GPU compiler could
  not put in cuBLAS's bias epilogue: it wrote the bias broadcast to the full output and
  added it as the matmul's C operand, for each of Q, K and V (``benchmarks/hlo_cost.py``,
  ``wrapped_broadcast`` kernels). The parameters and initial values are DenseGeneral's bit
  for bit; the outputs and gradients are the same up to float rounding (tested; on CPU the
  weight gradient's sum can group differently), so Simple's ``block_diagonal`` layout uses
  it and the default does not.

  Attributes:
    num_heads: H.
    head_dim: K.
    dtype: computation dtype.
    use_bias: with the bias (``DenseGeneral``'s ``use_bias``).
    dense_init: the initialisers' scheme, ``"lra"`` or ``"torch"`` (:func:`initializers`).

  Call: ``x [..., E] -> [..., H, K]`` in ``dtype``.
  """

  num_heads: int
  head_dim: int
  dtype: Dtype = jnp.float32
  use_bias: bool = True
  dense_init: str = "lra"

  @nn.compact
  def __call__(self, x):
    e, width = x.shape[-1], self.num_heads * self.head_dim

    def flat_init(init, flat_shape):
      return lambda rng, shape, dtype=jnp.float32: init(rng, flat_shape, dtype).reshape(shape)

    kernel_init, bias_init = initializers(e, self.dense_init)
    kernel = self.param("kernel", flat_init(kernel_init, (e, width)),
                        (e, self.num_heads, self.head_dim), jnp.float32)
    x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=self.dtype)
    y = jax.lax.dot_general(x, kernel.reshape(e, width), (((x.ndim - 1,), (0,)), ((), ())))
    if self.use_bias:
      bias = self.param("bias", flat_init(bias_init, (width,)),
                        (self.num_heads, self.head_dim), jnp.float32)
      y = y + bias.reshape(width).astype(y.dtype)
    return y.reshape(*x.shape[:-1], self.num_heads, self.head_dim)


class Attention(nn.Module):
  """The fields every attention variant takes, declared once; each variant subclasses it.

  The encoder block sets them from the model config (``AttentionSpec.build``); a variant
  adds its own options after them, and its docstring says what ``dropout_rate`` drops and in
  which dtype it sums. The three methods make the projections every checkpoint names alike,
  with this module's ``use_bias`` and ``dense_init``; call them inside the variant's compact
  ``__call__`` (the submodules are the variant's).

  Attributes:
    num_heads: H (``model.num_heads``).
    qkv_dim: D, the total width of queries, keys and values over all heads
      (``model.qkv_dim``).
    out_dim: O, the output width (``model.emb_dim``).
    dropout_rate: the variant's attention dropout (``model.attention_dropout_rate``); 0 by
      default.
    dtype: computation dtype.
    use_bias: biases on the projections (``model.attention_bias``; LRA's attentions have
      none, see :func:`head_projection`).
    dense_init: the projections' init, ``"lra"`` or ``"torch"`` (``model.dense_init``; see
      :func:`initializers`).

  Call (each variant's): ``(x_BxLxE float, mask_BxL bool | None, *, deterministic) ->
  y_BxLxO``.
  """

  num_heads: int
  qkv_dim: int
  out_dim: int
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  use_bias: bool = True
  dense_init: str = "lra"

  def project_qkv(self, x_BxLxE: jnp.ndarray, flat: bool = False
                  ) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """:func:`project_qkv` with this module's fields: ``(q, k, v)``, each
    ``[B, L, H, D // H]``, from the submodules ``query``, ``key`` and ``value``."""
    return project_qkv(x_BxLxE, self.num_heads, self.qkv_dim, self.dtype, flat,
                       use_bias=self.use_bias, dense_init=self.dense_init)

  def project_heads(self, x_BxLxE: jnp.ndarray, name: str) -> jnp.ndarray:
    """:func:`head_projection` with this module's fields: ``[B, L, H, D // H]`` from the
    submodule ``name``."""
    return head_projection(x_BxLxE, self.num_heads, self.qkv_dim, self.dtype, name,
                           use_bias=self.use_bias, dense_init=self.dense_init)

  def project_out(self, y_BxLxHxK: jnp.ndarray) -> jnp.ndarray:
    """:func:`output_projection` with this module's fields: ``[B, L, O]`` from the
    submodule ``out``."""
    return output_projection(y_BxLxHxK, self.out_dim, self.dtype, use_bias=self.use_bias,
                             dense_init=self.dense_init)


def check_max_length(variant: str, length: int, max_length: int) -> None:
  """Checks the input length against a variant's length-sized parameters.

  Args:
    variant: the registry name, for the message.
    length: tokens in the input (CLS included).
    max_length: the module's ``max_length`` field.

  Raises:
    ValueError: if ``length > max_length``; the message names
      ``model.attention_kwargs.max_length`` and says to set it to ``model.max_length + 1``.
  """
  if length > max_length:
    raise ValueError(
        f"{variant} got length {length} > model.attention_kwargs.max_length={max_length}; "
        "set model.attention_kwargs.max_length to model.max_length + 1")


def output_projection(y_BxLxHxK: jnp.ndarray, out_dim: int, dtype: Dtype, *,
                      use_bias: bool = True, dense_init: str) -> jnp.ndarray:
  """Merges heads with a learned ``DenseGeneral`` named ``out``.

  Args:
    y_BxLxHxK: per-head outputs.
    out_dim: O.
    dtype: computation dtype.
    use_bias: add a learned bias (see :func:`head_projection`).
    dense_init: the initialisers' scheme (:func:`initializers`, with fan-in ``H * K``).

  Returns:
    ``[B, L, O]``.
  """
  kernel_init, bias_init = initializers(y_BxLxHxK.shape[-2] * y_BxLxHxK.shape[-1],
                                        dense_init)
  return nn.DenseGeneral(features=out_dim, axis=(-2, -1), kernel_init=kernel_init,
                         bias_init=bias_init, use_bias=use_bias, dtype=dtype,
                         name="out")(y_BxLxHxK)


def default_mask(x_BxLxE: jnp.ndarray, mask_BxL: jnp.ndarray | None) -> jnp.ndarray:
  """Returns ``mask_BxL`` as bool, or all True when it is None."""
  if mask_BxL is None:
    return jnp.ones(x_BxLxE.shape[:2], dtype=bool)
  return mask_BxL.astype(bool)


def lra_mask(mask_BxL: jnp.ndarray, lra_masking: bool) -> jnp.ndarray:
  """The key mask a variant uses: ``mask_BxL``, or with ``lra_masking`` all True.

  LRA's linear, Performer and Linformer attentions never apply the padding mask
  (docs/lra_parity.md), so their pads act as keys; ``lra_masking=True`` (config field
  ``model.attention_kwargs.lra_masking``) reproduces that.

  Args:
    mask_BxL: bool ``[B, L]``, True for real tokens.
    lra_masking: reproduce LRA's missing mask.

  Returns:
    bool ``[B, L]``.
  """
  return jnp.ones_like(mask_BxL) if lra_masking else mask_BxL


# The flax collection the attention maps are sown into (read by ``simpletron_jax.tools.explain``).
MAPS = "attention_maps"


def sow_map(module: nn.Module, compute: Callable[[], jnp.ndarray]) -> bool:
  """Sows ``compute()`` as ``module``'s ``"map"`` in the :data:`MAPS` collection, on request.

  The map of a variant that has one is the ``[B, H, N, L]`` array ``A`` with which the
  per-head output, before any output projection, is ``y_i^h = sum_j A^h_ij v_j^h`` (``v`` the
  value projection's output, pads included): the softmax weights of ``softmax``, the implicit
  map of Simple and of the kernel attentions (``simple.simple_map``,
  ``linear.feature_attention_map``). ``compute`` runs only when the caller applies the model
  with ``mutable=[MAPS]`` and not while initialising (flax's ``sow`` into a collection that is
  not mutable is a no-op; here nothing is even traced), so a train or eval step, which does
  not ask for the collection, compiles to the same program as without this call (tested by
  ``tests/test_explain.py``).

  Args:
    module: the attention module, inside its compact ``__call__``.
    compute: builds the map; called at most once.

  Returns:
    True when the map was sown.
  """
  if module.is_initializing() or not module.is_mutable_collection(MAPS):
    return False
  module.sow(MAPS, "map", compute())
  return True
