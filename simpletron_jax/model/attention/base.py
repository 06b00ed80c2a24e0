"""Pieces shared by the attention modules: projections, initialisers, masks and maps.

Every variant subclasses :class:`Attention` and is called as
``y_BxLxO = Attn(num_heads=H, qkv_dim=D, out_dim=O)(x_BxLxE, mask_BxL, deterministic=True)``,
``mask_BxL`` bool, True for a real token. Initialisers follow LRA
``models/transformer/transformer.py`` (Xavier-uniform kernels, normal(1e-6) biases), or torch's
``nn.Linear`` defaults under ``model.dense_init="torch"`` (the SimpleTRON authors' notebooks).
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
# model.dense_init: LRA's (above) or torch nn.Linear's.
INITS = ("lra", "torch")
# torch's kaiming_uniform(a=sqrt(5)) is U(+-1 / sqrt(fan_in)): variance 1 / (3 fan_in).
TORCH_KERNEL_INIT = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")

Dtype = Any
Initializer = Callable[..., jnp.ndarray]

PLATFORMS = ("cpu", "gpu", "tpu")
_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("target_platform",
                                                                     default=None)


def target_platform() -> str:
  """The platform traced for: the innermost :func:`compiling_for`, else ``jax.default_backend()``.

  Kernel choices (``SoftmaxAttention``'s ``flash``) read this, so a step lowered on a CPU host
  for TPU devices picks the TPU's kernels.
  """
  override = _TARGET.get()
  return jax.default_backend() if override is None else override


@contextlib.contextmanager
def compiling_for(platform: str) -> Iterator[None]:
  """Makes :func:`target_platform` return ``platform`` (``"cpu"``, ``"gpu"``, ``"tpu"``) here.

  Wrap the tracing, not ``.compile()``. A ``ContextVar``: this thread and asyncio task only.

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
  """torch ``nn.Linear``'s bias init ``U(+-1/sqrt(fan_in))``, as a flax initialiser."""
  bound = 1.0 / float(fan_in) ** 0.5

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return init


def initializers(fan_in: int, init: str) -> tuple[Initializer, Initializer]:
  """``(kernel_init, bias_init)`` of a Dense layer of (flat) input width ``fan_in``.

  ``init`` is ``model.dense_init``: ``"lra"`` (Xavier-uniform, normal(1e-6)) or ``"torch"``
  (both ``U(+-1/sqrt(fan_in))``). Kernels are drawn on the flat ``[fan_in, out]`` shape.

  Raises:
    ValueError: naming ``model.dense_init`` for an unknown scheme.
  """
  if init not in INITS:
    raise ValueError(f"model.dense_init={init!r}; expected one of {list(INITS)}")
  if init == "torch":
    return TORCH_KERNEL_INIT, torch_bias_init(fan_in)
  return KERNEL_INIT, BIAS_INIT


def check_head_dims(qkv_dim: int, num_heads: int) -> int:
  """The per-head width ``qkv_dim // num_heads``.

  Raises:
    ValueError: naming ``model.qkv_dim`` and ``model.num_heads`` unless a positive multiple.
  """
  if num_heads <= 0 or qkv_dim <= 0 or qkv_dim % num_heads:
    raise ValueError(
        f"model.qkv_dim={qkv_dim} must be a positive multiple of "
        f"model.num_heads={num_heads}")
  return qkv_dim // num_heads


def project_qkv(x_BxLxE: jnp.ndarray, num_heads: int, qkv_dim: int, dtype: Dtype,
                flat: bool = False, *, use_bias: bool = True, dense_init: str
                ) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
  """``(q, k, v)``, each ``[B, L, H, D // H]``, from ``x_BxLxE`` by :func:`head_projection`.

  Call inside a compact method: it makes the submodules ``query``, ``key`` and ``value``, so
  every variant's checkpoint names them alike.
  """
  return tuple(head_projection(x_BxLxE, num_heads, qkv_dim, dtype, name, flat,
                               use_bias=use_bias, dense_init=dense_init)
               for name in ("query", "key", "value"))


def head_projection(x_BxLxE: jnp.ndarray, num_heads: int, qkv_dim: int, dtype: Dtype,
                    name: str, flat: bool = False, *, use_bias: bool = True,
                    dense_init: str) -> jnp.ndarray:
  """One per-head projection ``[B, L, E] -> [B, L, H, D // H]``, a ``DenseGeneral`` named ``name``.

  Args:
    x_BxLxE: float input.
    num_heads: H.
    qkv_dim: D, the width over all heads.
    dtype: computation dtype.
    name: the submodule name, e.g. ``"value"``.
    flat: compute it as :class:`HeadProjection` (same parameters and function).
    use_bias: ``model.attention_bias``; LRA's attentions have none (``bias=False`` in
      ``models/transformer/transformer.py``), the authors' ``nn.Linear`` one.
    dense_init: the scheme of :func:`initializers`.

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
  """``nn.DenseGeneral(features=(H, K))``'s parameters and function, computed as one flat matmul.

  ``kernel [E, H, K]`` and ``bias [H, K]``, float32, initialised bit for bit as DenseGeneral;
  the product uses ``[E, H*K]`` and a ``[H*K]`` bias, which XLA's GPU compiler can fuse into
  cuBLAS's bias epilogue (DenseGeneral's 4-D bias it cannot). Outputs equal up to float
  rounding, so only Simple's ``block_diagonal`` layout uses it.
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
  """The fields every attention variant takes; each variant subclasses it.

  The encoder block sets them (``AttentionSpec.build``); a variant adds its options after them.
  Call the ``project_*`` methods inside the variant's compact ``__call__``.

  Attributes:
    num_heads: H (``model.num_heads``).
    qkv_dim: D, query/key/value width over all heads (``model.qkv_dim``).
    out_dim: O, the output width (``model.emb_dim``).
    dropout_rate: the variant's attention dropout (``model.attention_dropout_rate``).
    dtype: computation dtype.
    use_bias: biases on the projections (``model.attention_bias``).
    dense_init: ``"lra"`` or ``"torch"`` (``model.dense_init``).

  Call: ``(x_BxLxE float, mask_BxL bool | None, *, deterministic) -> y_BxLxO``.
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
    """:func:`project_qkv` with this module's fields."""
    return project_qkv(x_BxLxE, self.num_heads, self.qkv_dim, self.dtype, flat,
                       use_bias=self.use_bias, dense_init=self.dense_init)

  def project_heads(self, x_BxLxE: jnp.ndarray, name: str) -> jnp.ndarray:
    """:func:`head_projection` with this module's fields."""
    return head_projection(x_BxLxE, self.num_heads, self.qkv_dim, self.dtype, name,
                           use_bias=self.use_bias, dense_init=self.dense_init)

  def project_out(self, y_BxLxHxK: jnp.ndarray) -> jnp.ndarray:
    """:func:`output_projection` with this module's fields."""
    return output_projection(y_BxLxHxK, self.out_dim, self.dtype, use_bias=self.use_bias,
                             dense_init=self.dense_init)


def check_max_length(variant: str, length: int, max_length: int) -> None:
  """Checks ``length`` (CLS included) against a variant's length-sized parameters.

  Raises:
    ValueError: if ``length > max_length``, saying to set ``model.attention_kwargs.max_length``
      to ``model.max_length + 1``.
  """
  if length > max_length:
    raise ValueError(
        f"{variant} got length {length} > model.attention_kwargs.max_length={max_length}; "
        "set model.attention_kwargs.max_length to model.max_length + 1")


def output_projection(y_BxLxHxK: jnp.ndarray, out_dim: int, dtype: Dtype, *,
                      use_bias: bool = True, dense_init: str) -> jnp.ndarray:
  """Merges heads ``[B, L, H, K] -> [B, L, O]`` with a ``DenseGeneral`` named ``out``.

  ``use_bias`` and ``dense_init`` as in :func:`head_projection` (fan-in ``H * K``).
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
  """The key mask a variant uses: ``mask_BxL``, or all True with ``lra_masking``.

  ``model.attention_kwargs.lra_masking``: LRA's linear, Performer and Linformer never apply
  the padding mask (docs/lra_parity.md).
  """
  return jnp.ones_like(mask_BxL) if lra_masking else mask_BxL


# The collection attention maps are sown into (read by ``simpletron_jax.tools.explain``).
MAPS = "attention_maps"


def sow_map(module: nn.Module, compute: Callable[[], jnp.ndarray]) -> bool:
  """Sows ``compute()`` as ``module``'s ``"map"`` in :data:`MAPS`, on request.

  The map is ``[B, H, N, L]`` ``A`` with ``y_i^h = sum_j A^h_ij v_j^h`` (``v`` the values).
  ``compute`` runs only when applied with ``mutable=[MAPS]`` and not initialising, so train and
  eval steps compile as without this call (``tests/test_explain.py``). Returns True when sown.
  """
  if module.is_initializing() or not module.is_mutable_collection(MAPS):
    return False
  module.sow(MAPS, "map", compute())
  return True
