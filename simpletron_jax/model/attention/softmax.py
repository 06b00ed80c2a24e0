"""Softmax attention, the LRA Transformer baseline (LRA ``models/transformer/transformer.py``).

``softmax(Q K^T / sqrt(d)) V`` per head (Vaswani et al., 2017). Three implementations compute
the same function:

* ``einsum``: LRA's explicit ``[B, H, L, L]`` weights, with attention dropout.
* ``xla``: ``jax.nn.dot_product_attention(implementation="xla")`` with a boolean mask.
* ``flash`` (Dao et al., 2022), for the platform of :func:`base.target_platform`: on a GPU
  cuDNN's kernel with key lengths from the mask (rows must be right-padded; others come out
  NaN), on a TPU the Pallas kernel with the mask as segment ids (any mask).

Where the requested one cannot run (dtype, head dim, ``lra_masking``, ``num_queries``), the
module falls back to ``xla`` (to ``einsum`` with attention dropout active) and logs the reason
once. Limits: docs/fast_paths.md (GPU), docs/tpu.md (TPU).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp

from simpletron_jax.model.attention import base, registry

IMPLEMENTATIONS = ("einsum", "xla", "flash")
# "fused": jax.nn.dot_product_attention with implementation=None (XLA), an alias of "xla".
ALIASES = {"fused": "xla", "cudnn": "flash"}
FLASH_DTYPES = ("bfloat16", "float16")
# cuDNN's training kernels reject odd lengths; flash_attention pads L to a multiple of this.
FLASH_LENGTH_MULTIPLE = 64
# The Pallas TPU kernel: float16 fails in Mosaic; with segment ids the key blocks are
# multiples of 128 lanes, so L is padded to 128 and the largest dividing block is used.
TPU_FLASH_DTYPES = ("float32", "bfloat16")
TPU_FLASH_LENGTH_MULTIPLE = 128
TPU_FLASH_BLOCKS = (512, 256, 128)
FLASH_KERNELS = {"gpu": "cuDNN flash attention", "tpu": "the Pallas TPU flash attention kernel"}
_LOGGED_REASONS: set[str] = set()
_RECORDING = threading.local()   # .reasons: the list of the innermost recording_fallbacks()
logger = logging.getLogger(__name__)


def resolve_implementation(requested: str, *, backend: str, dtype, head_dim: int,
                           dropout_active: bool) -> tuple[str, str]:
  """``(implementation, reason)``: what computes ``requested``'s function here, and why it differs.

  Args:
    requested: ``"einsum"``, ``"xla"``, ``"flash"`` or an alias in :data:`ALIASES`.
    backend: :func:`base.target_platform`'s ``"cpu"``, ``"gpu"`` or ``"tpu"``.
    dtype: the computation dtype.
    head_dim: per-head width K.
    dropout_active: attention dropout is on.

  ``reason`` is empty when the requested one runs; kernel limits beyond the head dim are found
  by the module at trace time.

  Raises:
    ValueError: naming ``model.attention_kwargs.implementation`` for an unknown one.
  """
  impl = ALIASES.get(requested, requested)
  if impl not in IMPLEMENTATIONS:
    raise ValueError(f"unknown softmax implementation {requested!r} "
                     f"(model.attention_kwargs.implementation); expected one of "
                     f"{IMPLEMENTATIONS}")
  if impl != "einsum" and dropout_active:
    kernel = f" ({FLASH_KERNELS[backend]})" if impl == "flash" and backend in FLASH_KERNELS else ""
    return "einsum", (f"softmax implementation {impl!r}{kernel} has no attention dropout; "
                      "using 'einsum' (set model.attention_dropout_rate=0 to use it)")
  if impl != "flash":
    return impl, ""
  dtype_name = jnp.dtype(dtype).name
  if backend == "tpu":
    kernel = FLASH_KERNELS["tpu"]
    if dtype_name not in TPU_FLASH_DTYPES:
      return "xla", (f"{kernel} needs float32 or bfloat16 (model.dtype is {dtype_name}); "
                     "using 'xla'")
    if head_dim > 128 and head_dim % 128:
      return "xla", (f"{kernel} needs a head dim of at most 128 or a multiple of 128 (got "
                     f"{head_dim}); using 'xla'")
    return "flash", ""
  if backend != "gpu":
    return "xla", ("flash attention needs a GPU (cuDNN) or a TPU (the Pallas kernel) "
                   f"(backend is {backend!r}); using 'xla'")
  if dtype_name not in FLASH_DTYPES:
    return "xla", (f"cuDNN flash attention needs bfloat16 or float16 (model.dtype is "
                   f"{dtype_name}); using 'xla'")
  if head_dim % 8 or head_dim > 128:
    return "xla", (f"cuDNN flash attention needs a head dim that is a multiple of 8 and at "
                   f"most 128 (got {head_dim}); using 'xla'")
  return "flash", ""


def log_fallback_once(reason: str) -> bool:
  """Logs ``reason`` once per process (True if now); always tells :func:`recording_fallbacks`."""
  if not reason:
    return False
  reasons = getattr(_RECORDING, "reasons", None)
  if reasons is not None:
    reasons.append(reason)
  if reason in _LOGGED_REASONS:
    return False
  _LOGGED_REASONS.add(reason)
  logger.warning("SoftmaxAttention: %s", reason)
  return True


@contextlib.contextmanager
def recording_fallbacks() -> Iterator[list[str]]:
  """Yields the list of every fallback reason this thread meets in the (innermost) block."""
  outer = getattr(_RECORDING, "reasons", None)
  _RECORDING.reasons = reasons = []
  try:
    yield reasons
  finally:
    _RECORDING.reasons = outer


def key_lengths(mask_BxL: jnp.ndarray) -> jnp.ndarray:
  """``[B]`` int32 real keys per row, at least 1 (an all-pad row stays finite in cuDNN)."""
  return jnp.maximum(mask_BxL.sum(axis=-1), 1).astype(jnp.int32)


def is_right_padded(mask_BxL: jnp.ndarray) -> jnp.ndarray:
  """``[B]`` bool: True where the row's real tokens are exactly its first positions."""
  prefix_BxL = jnp.arange(mask_BxL.shape[1])[None, :] < mask_BxL.sum(axis=-1)[:, None]
  return jnp.all(prefix_BxL == mask_BxL, axis=-1)


def softmax_weights(q_BxNxHxK, k_BxLxHxK, keep_Bx1xNxL):
  """``[B, H, N, L]`` weights of :func:`einsum_attention` before dropout, in q's dtype.

  Softmax in float32 over the keys ``keep_Bx1xNxL`` allows (others get exactly 0; a row with
  none spreads evenly over all L). Sown as the map whatever the implementation.
  """
  q = q_BxNxHxK / jnp.sqrt(q_BxNxHxK.shape[-1]).astype(q_BxNxHxK.dtype)
  logits_BxHxNxL = jnp.einsum("bqhd,bkhd->bhqk", q, k_BxLxHxK)
  big_neg = jnp.finfo(logits_BxHxNxL.dtype).min
  logits_BxHxNxL = jnp.where(keep_Bx1xNxL, logits_BxHxNxL, big_neg)
  weights_BxHxNxL = jax.nn.softmax(logits_BxHxNxL.astype(jnp.float32), axis=-1)
  return weights_BxHxNxL.astype(q_BxNxHxK.dtype)


def einsum_attention(q_BxNxHxK, k_BxLxHxK, v_BxLxHxK, keep_Bx1xNxL, dropout=None):
  """LRA's einsum attention ``[B, N, H, K]``: :func:`softmax_weights`, ``dropout`` (or None), v."""
  weights_BxHxNxL = softmax_weights(q_BxNxHxK, k_BxLxHxK, keep_Bx1xNxL)
  if dropout is not None:
    weights_BxHxNxL = dropout(weights_BxHxNxL)
  return jnp.einsum("bhqk,bkhd->bqhd", weights_BxHxNxL, v_BxLxHxK)


def flash_attention(q_BxNxHxK, k_BxLxHxK, v_BxLxHxK, mask_BxL, causal: bool,
                    implementation: str | None = None):
  """Flash attention ``[B, L, H, K]`` with the padding mask: cuDNN's kernel or the Pallas TPU one.

  cuDNN masks keys by length and rejects odd lengths in training (LRA's ``max_length + 1``), so
  q, k, v are zero-padded to a multiple of :data:`FLASH_LENGTH_MULTIPLE`; the padded keys lie
  beyond every key length and the padded rows are cut off.

  Args:
    q_BxNxHxK, k_BxLxHxK, v_BxLxHxK: N == L; cuDNN needs bfloat16 or float16.
    mask_BxL: bool, True for real tokens; right-padded for cuDNN (other rows come out NaN).
    causal: causal mask.
    implementation: None: ``"pallas"`` on a TPU target, else ``"cudnn"``; ``"xla"`` runs the
      cuDNN call's padding through XLA (CPU tests).

  Raises:
    ValueError: if N != L. The kernels' own trace-time checks raise NotImplementedError,
      RuntimeError or ValueError, on which the module falls back to ``xla``.
  """
  if implementation is None:
    implementation = "pallas" if base.target_platform() == "tpu" else "cudnn"
  if implementation == "pallas":
    return tpu_flash_attention(q_BxNxHxK, k_BxLxHxK, v_BxLxHxK, mask_BxL, causal)
  length = k_BxLxHxK.shape[1]
  if q_BxNxHxK.shape[1] != length:
    raise ValueError(f"flash attention needs a query per key, got {q_BxNxHxK.shape[1]} "
                     f"queries and {length} keys")
  pad = -length % FLASH_LENGTH_MULTIPLE
  q, k, v = (jnp.pad(t, ((0, 0), (0, pad), (0, 0), (0, 0)))
             for t in (q_BxNxHxK, k_BxLxHxK, v_BxLxHxK))
  y = jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                   key_value_seq_lengths=key_lengths(mask_BxL),
                                   implementation=implementation)[:, :length]
  ok_Bx1x1x1 = is_right_padded(mask_BxL)[:, None, None, None]
  return jnp.where(ok_Bx1x1x1, y, jnp.asarray(jnp.nan, y.dtype))


def tpu_flash_attention(q_BxNxHxK, k_BxLxHxK, v_BxLxHxK, mask_BxL, causal: bool):
  """The Pallas TPU flash-attention kernel ``[B, L, H, K]``, the padding mask as segment ids.

  Every query has id 1 and each key its mask, so every query attends to the real keys only, as
  :func:`einsum_attention`; the scale is applied to float32 logits (einsum rounds in q's dtype).
  The length is zero-padded to :data:`TPU_FLASH_LENGTH_MULTIPLE` (keys id 0, rows cut off). A
  row with no real key gets zero logits over all L keys, einsum's even spread; with ``causal``
  a query before its row's first real key differs from einsum (CLS at 0 rules it out). Runs on
  a TPU, or on a CPU under ``force_tpu_interpret_mode()`` (tests).

  Args:
    q_BxNxHxK, k_BxLxHxK, v_BxLxHxK: N == L, float32 or bfloat16.
    mask_BxL: bool, True for real tokens, any pattern.
    causal: position i attends to j <= i only.

  Raises:
    ValueError: if N != L; the kernel's trace-time checks raise too (Mosaic rejects float16
      only when compiling for a TPU).
  """
  from jax.experimental.pallas.ops.tpu import (  # pylint: disable=import-outside-toplevel
      flash_attention as pallas_tpu)
  length, head_dim = k_BxLxHxK.shape[1], k_BxLxHxK.shape[-1]
  if q_BxNxHxK.shape[1] != length:
    raise ValueError(f"flash attention needs a query per key, got {q_BxNxHxK.shape[1]} "
                     f"queries and {length} keys")
  pad = -length % TPU_FLASH_LENGTH_MULTIPLE
  has_real_B = jnp.any(mask_BxL, axis=-1)
  # A row without a real key takes all L keys with zero logits: einsum's even spread.
  keys_BxL = mask_BxL | ~has_real_B[:, None]
  kv_ids_BxP = jnp.pad(keys_BxL.astype(jnp.int32), ((0, 0), (0, pad)))
  q_ids_BxP = jnp.ones_like(kv_ids_BxP)
  q_BxNxHxK = jnp.where(has_real_B[:, None, None, None], q_BxNxHxK,
                        jnp.zeros((), q_BxNxHxK.dtype))

  def to_kernel(t_BxLxHxK):
    return jnp.swapaxes(jnp.pad(t_BxLxHxK, ((0, 0), (0, pad), (0, 0), (0, 0))), 1, 2)

  block = next(b for b in TPU_FLASH_BLOCKS if (length + pad) % b == 0)
  blocks = pallas_tpu.BlockSizes(
      block_q=block, block_k_major=block, block_k=block, block_b=1,
      block_q_major_dkv=block, block_k_major_dkv=block, block_k_dkv=block, block_q_dkv=block,
      block_k_major_dq=block, block_k_dq=block, block_q_dq=block)
  y_BxHxPxK = pallas_tpu.flash_attention(
      to_kernel(q_BxNxHxK), to_kernel(k_BxLxHxK), to_kernel(v_BxLxHxK),
      segment_ids=pallas_tpu.SegmentIds(q=q_ids_BxP, kv=kv_ids_BxP), causal=causal,
      sm_scale=1.0 / float(head_dim) ** 0.5, block_sizes=blocks)
  return jnp.swapaxes(y_BxHxPxK, 1, 2)[:, :length]


class SoftmaxAttention(base.Attention):
  """Multi-head softmax self-attention (fields of :class:`base.Attention`, then its own).

  Attributes:
    dropout_rate: dropout on the weights (LRA's ``attention_dropout_rate``); ``einsum`` only.
    causal: position i attends to positions j <= i only.
    implementation: ``"einsum"`` (default), ``"xla"`` or ``"flash"`` (module docstring);
      aliases ``"fused"`` (xla) and ``"cudnn"`` (flash).
    num_queries: N > 0: outputs ``y_BxNxO`` at the first N positions only, keys and values
      over all L (the last block with CLS pooling); 0: every position.
    lra_masking: True: LRA's query AND key mask (``models/transformer/transformer.py``), so a
      pad query spreads evenly over all L; real positions are unchanged, pad rows matter only
      to ``model.lra_mean_over_pads``.

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO`` (``y_BxNxO``); pad
  keys get zero weight. Sows :func:`softmax_weights` as the map (:func:`base.sow_map`).

  Raises:
    ValueError: for an unknown ``implementation``, or ``num_queries`` larger than L.
  """

  causal: bool = False
  implementation: str = "einsum"
  num_queries: int = 0
  lra_masking: bool = False

  @nn.compact
  def __call__(self, x_BxLxE, mask_BxL=None, *, deterministic: bool = True):
    mask_BxL = base.default_mask(x_BxLxE, mask_BxL)
    length = x_BxLxE.shape[1]
    n = self.num_queries or length
    if n > length:
      raise ValueError(f"num_queries={n} exceeds the sequence length {length}")
    q = self.project_heads(x_BxLxE[:, :n], "query")
    k, v = (self.project_heads(x_BxLxE, name) for name in ("key", "value"))
    base.sow_map(self, lambda: softmax_weights(q, k, self._keep_mask(mask_BxL, n, length)))
    backend = base.target_platform()
    impl, reason = resolve_implementation(
        self.implementation, backend=backend, dtype=self.dtype,
        head_dim=q.shape[-1], dropout_active=self.dropout_rate > 0 and not deterministic)
    kernel = FLASH_KERNELS.get(backend, "flash attention")
    if impl == "flash" and self.lra_masking:
      impl, reason = "xla", f"{kernel} masks keys only; lra_masking=True uses 'xla'"
    if impl == "flash" and n != length:
      impl, reason = "xla", (f"{kernel} runs full self-attention only here; the block with "
                             f"num_queries={n} uses 'xla'")
    log_fallback_once(reason)
    y_BxNxHxK = None
    if impl == "flash":
      try:
        y_BxNxHxK = flash_attention(q, k, v, mask_BxL, self.causal,
                                    implementation="pallas" if backend == "tpu" else "cudnn")
      except (NotImplementedError, RuntimeError, ValueError) as error:
        log_fallback_once(f"{kernel} cannot run ({error}); using 'xla'")
        impl = "xla"
    if y_BxNxHxK is None:
      keep_Bx1xNxL = self._keep_mask(mask_BxL, n, length)
      attend = self._einsum if impl == "einsum" else self._xla
      y_BxNxHxK = attend(q, k, v, keep_Bx1xNxL, deterministic)
    return self.project_out(y_BxNxHxK)

  def _keep_mask(self, mask_BxL, n: int, length: int):
    """``[B, 1, N, L]`` bool: real keys (AND real queries with ``lra_masking``), causal."""
    keep_Bx1xNxL = jnp.broadcast_to(mask_BxL[:, None, None, :],
                                    (mask_BxL.shape[0], 1, n, length))
    if self.lra_masking:
      keep_Bx1xNxL = keep_Bx1xNxL & mask_BxL[:, None, :n, None]
    if self.causal:
      keep_Bx1xNxL = keep_Bx1xNxL & jnp.tril(jnp.ones((length, length), bool))[None, None, :n]
    return keep_Bx1xNxL

  def _einsum(self, q, k, v, keep_Bx1xNxL, deterministic):
    dropout = nn.Dropout(self.dropout_rate)
    return einsum_attention(q, k, v, keep_Bx1xNxL,
                            dropout=lambda w: dropout(w, deterministic=deterministic))

  def _xla(self, q, k, v, keep_Bx1xNxL, deterministic):
    del deterministic  # resolve_implementation sends active dropout to einsum
    return jax.nn.dot_product_attention(q, k, v, mask=keep_Bx1xNxL, implementation="xla")


registry.register(registry.AttentionSpec(
    "softmax", SoftmaxAttention, quadratic=True, paper="Vaswani et al. (2017); LRA Transformer",
    length_padding_exact=True))
