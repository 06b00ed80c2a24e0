"""Softmax dot-product attention: the LRA Transformer baseline.

``softmax(Q K^T / sqrt(d)) V`` per head (Vaswani et al., 2017), as used by LRA
``models/transformer/transformer.py``. Quadratic in time; the ``flash`` implementation
(cuDNN's on a GPU, the Pallas kernel on a TPU) is linear in memory.

Three implementations compute the same function:

* ``einsum``: the explicit ``[B, H, L, L]`` weights of LRA's code, with attention dropout.
* ``xla``: ``jax.nn.dot_product_attention(implementation="xla")`` with a boolean key mask.
* ``flash``: a fused flash-attention kernel (Dao et al., 2022), chosen by the platform the
  module is compiled for (:func:`base.target_platform`: ``jax.default_backend()``, or the
  platform of a :func:`base.compiling_for` block):

  - GPU: ``jax.nn.dot_product_attention(implementation="cudnn")`` with
    ``key_value_seq_lengths`` taken from the padding mask. cuDNN masks keys by length, so the
    mask must be right-padded (real tokens first, as every loader here and CLS at position 0
    produce); a row whose mask is not a prefix gets NaN outputs instead of a silently
    different function. A row with no real token at all (CLS rules it out) attends to its
    first key, where ``einsum`` spreads its weight evenly over all keys.
  - TPU: the Pallas TPU kernel that ships with JAX
    (``jax.experimental.pallas.ops.tpu.flash_attention``), with segment ids from the padding
    mask (every query id 1, key id 1 for a real key and 0 for a pad), so any mask works and
    every query, real or pad, attends to the real keys only; a row with no real token spreads
    its weight evenly over all L keys as ``einsum`` does (with ``causal``, only where every
    query sees a real key, as with CLS at position 0).

Where the requested implementation cannot compute the function (cuDNN needs a GPU,
bfloat16/float16 and a head dim that is a multiple of 8 up to 128; the TPU kernel needs float32
or bfloat16 and a head dim of at most 128 or a multiple of 128; no fused path has attention
dropout, LRA's query-and-key mask or fewer queries than keys), the module falls back
(``flash`` -> ``xla``, and to ``einsum`` when attention dropout is active) and logs the reason
once per reason.
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
# cuDNN's training kernels reject odd lengths (jax 0.11.2 on an H100 at L = 4097);
# flash_attention pads the length to a multiple of this (at most 63 extra rows).
FLASH_LENGTH_MULTIPLE = 64
# The Pallas TPU kernel: float16 fails in Mosaic's compiler (libtpu 0.0.52, "Invalid vector
# type for load"); a head dim above 128 must be a multiple of 128; with segment ids the key
# blocks must be multiples of 128 lanes, so the length is padded to a multiple of 128 and the
# largest of TPU_FLASH_BLOCKS dividing it is the block size.
TPU_FLASH_DTYPES = ("float32", "bfloat16")
TPU_FLASH_LENGTH_MULTIPLE = 128
TPU_FLASH_BLOCKS = (512, 256, 128)
# What ``flash`` runs on each platform, as the fallback reasons name it.
FLASH_KERNELS = {"gpu": "cuDNN flash attention", "tpu": "the Pallas TPU flash attention kernel"}
_LOGGED_REASONS: set[str] = set()
_RECORDING = threading.local()   # .reasons: the list of the innermost recording_fallbacks()
logger = logging.getLogger(__name__)


def resolve_implementation(requested: str, *, backend: str, dtype, head_dim: int,
                           dropout_active: bool) -> tuple[str, str]:
  """The implementation that computes ``requested``'s function here, and why it differs.

  Args:
    requested: ``"einsum"``, ``"xla"`` or ``"flash"`` (or an alias in :data:`ALIASES`).
    backend: the platform compiled for, :func:`base.target_platform` (``"cpu"``, ``"gpu"``
      or ``"tpu"``); ``flash`` is cuDNN's kernel on ``"gpu"`` and the Pallas kernel on
      ``"tpu"``.
    dtype: the computation dtype.
    head_dim: per-head width K.
    dropout_active: attention dropout is on (rate > 0 and not deterministic).

  Returns:
    ``(implementation, reason)``: ``reason`` is ``""`` when the requested one runs, else one
    line naming the kernel and the limit. Kernel shape limits beyond the head dim are found
    at trace time by the module.

  Raises:
    ValueError: for an unknown implementation; names
      ``model.attention_kwargs.implementation``.
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
  """Logs ``reason`` as a warning the first time it is seen in this process.

  A :func:`recording_fallbacks` block open in this thread also gets ``reason``, every time.

  Returns:
    True if it was logged now, False if it had been logged before (or is empty).
  """
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
  """Collects the fallback reasons met while this thread traces inside the block.

  Unlike the log, which says each reason once per process, the list gets every reason each
  time a module meets it, and only this thread's: ``benchmarks/speed_memory.py`` traces several
  configs at once in threads and reports each one's fallbacks.

  Yields:
    The list of reasons (strings), filled while the block runs; nested blocks fill only the
    innermost.
  """
  outer = getattr(_RECORDING, "reasons", None)
  _RECORDING.reasons = reasons = []
  try:
    yield reasons
  finally:
    _RECORDING.reasons = outer


def key_lengths(mask_BxL: jnp.ndarray) -> jnp.ndarray:
  """Real keys per row, at least 1 (an all-pad row keeps one key so cuDNN stays finite).

  Returns:
    ``[B]`` int32.
  """
  return jnp.maximum(mask_BxL.sum(axis=-1), 1).astype(jnp.int32)


def is_right_padded(mask_BxL: jnp.ndarray) -> jnp.ndarray:
  """``[B]`` bool: True where the row's real tokens are exactly its first positions."""
  prefix_BxL = jnp.arange(mask_BxL.shape[1])[None, :] < mask_BxL.sum(axis=-1)[:, None]
  return jnp.all(prefix_BxL == mask_BxL, axis=-1)


def softmax_weights(q_BxNxHxK, k_BxLxHxK, keep_Bx1xNxL):
  """The attention weights of :func:`einsum_attention`, before its dropout.

  ``softmax(q k^T / sqrt(K))`` over the kept keys (a key that is not kept gets exactly 0), in
  float32 and cast back to q's dtype (Vaswani et al., 2017; LRA's einsum attention). The
  module sows them for ``simpletron_jax.tools.explain`` (:func:`base.sow_map`), whatever its
  implementation: ``xla`` and ``flash`` compute the same function without forming them.

  Args:
    q_BxNxHxK: queries; k_BxLxHxK: keys.
    keep_Bx1xNxL: bool, True where query i may attend to key j.

  Returns:
    ``[B, H, N, L]`` in q's dtype; each row sums to 1 (a row with no kept key spreads its
    weight evenly over all L keys).
  """
  q = q_BxNxHxK / jnp.sqrt(q_BxNxHxK.shape[-1]).astype(q_BxNxHxK.dtype)
  logits_BxHxNxL = jnp.einsum("bqhd,bkhd->bhqk", q, k_BxLxHxK)
  big_neg = jnp.finfo(logits_BxHxNxL.dtype).min
  logits_BxHxNxL = jnp.where(keep_Bx1xNxL, logits_BxHxNxL, big_neg)
  weights_BxHxNxL = jax.nn.softmax(logits_BxHxNxL.astype(jnp.float32), axis=-1)
  return weights_BxHxNxL.astype(q_BxNxHxK.dtype)


def einsum_attention(q_BxNxHxK, k_BxLxHxK, v_BxLxHxK, keep_Bx1xNxL, dropout=None):
  """LRA's einsum softmax attention: explicit ``[B, H, N, L]`` weights.

  ``softmax(q k^T / sqrt(K))`` over the kept keys, in float32, cast back to q's dtype, then
  ``dropout`` (a callable on the weights, or None) and the product with v.

  Args:
    q_BxNxHxK: queries; k_BxLxHxK, v_BxLxHxK: keys and values.
    keep_Bx1xNxL: bool, True where query i may attend to key j.

  Returns:
    ``[B, N, H, K]`` in q's dtype.
  """
  weights_BxHxNxL = softmax_weights(q_BxNxHxK, k_BxLxHxK, keep_Bx1xNxL)
  if dropout is not None:
    weights_BxHxNxL = dropout(weights_BxHxNxL)
  return jnp.einsum("bhqk,bkhd->bqhd", weights_BxHxNxL, v_BxLxHxK)


def flash_attention(q_BxNxHxK, k_BxLxHxK, v_BxLxHxK, mask_BxL, causal: bool,
                    implementation: str | None = None):
  """Flash attention with the padding mask: cuDNN's kernel, or the Pallas TPU kernel.

  cuDNN (``"cudnn"``) masks keys by length (``key_value_seq_lengths``) and rejects some
  lengths in training (an odd L, such as LRA's ``max_length + 1`` with the CLS token, raises
  "Unsupported sequence length"), so q, k and v are zero-padded at the end to a multiple of
  :data:`FLASH_LENGTH_MULTIPLE` positions. The padded keys lie beyond every row's key length,
  so they get no weight; the padded query rows are cut off. The function is unchanged.
  ``"pallas"`` is :func:`tpu_flash_attention`.

  Args:
    q_BxNxHxK: queries of every position (N == L: self-attention).
    k_BxLxHxK, v_BxLxHxK: keys and values (cuDNN: bfloat16 or float16).
    mask_BxL: bool, True for real tokens; right-padded for cuDNN.
    causal: causal mask.
    implementation: None (default): ``"pallas"`` when :func:`base.target_platform` is
      ``"tpu"``, else ``"cudnn"``. ``"xla"`` runs the cuDNN call through XLA, which the CPU
      tests use to check the padding and key lengths.

  Returns:
    ``[B, L, H, K]``; with cuDNN, rows whose mask is not right-padded are NaN.

  Raises:
    ValueError: if N != L.
    NotImplementedError, RuntimeError: from cuDNN's or the Pallas kernel's checks at trace
      time (no cuDNN, unsupported shape); the module catches them and falls back to ``xla``.
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
  """The Pallas TPU flash-attention kernel with the padding mask as segment ids.

  ``jax.experimental.pallas.ops.tpu.flash_attention.flash_attention`` (layout
  ``[B, H, L, K]``, online softmax over key blocks in float32, its own backward kernels)
  computes ``softmax(q k^T / sqrt(K)) v`` where a query and a key attend to each other only
  if their segment ids are equal. Every query gets id 1 and each key its mask (1 real,
  0 pad), so every query, real or pad, attends to the real keys only, for any mask, as
  :func:`einsum_attention` with the key mask does. The scale ``1 / sqrt(K)`` is the kernel's
  ``sm_scale``, applied to the float32 logits (``einsum_attention`` scales q in q's dtype
  and, in bfloat16, rounds its logits to bfloat16: the same function, rounded differently).

  The length is zero-padded at the end to a multiple of :data:`TPU_FLASH_LENGTH_MULTIPLE`
  (the kernel's key blocks are multiples of 128 lanes), the padded keys get id 0 and the
  padded query rows are cut off, so LRA's odd lengths (``max_length + 1`` with CLS) keep the
  function. Blocks are the largest of :data:`TPU_FLASH_BLOCKS` dividing the padded length.
  A row with no real token attends to all of its L keys with zero logits (its queries are
  zeroed), which is ``einsum``'s even spread and its zero gradient. With ``causal``, a query
  that sees no real key (one before its row's first real token, or any query of a row with
  none) spreads its weight otherwise than ``einsum``'s even spread over all L keys; CLS at
  position 0 rules this out.

  Args:
    q_BxNxHxK: queries of every position (N == L), float32 or bfloat16.
    k_BxLxHxK, v_BxLxHxK: keys and values, q's dtype.
    mask_BxL: bool, True for real tokens (any pattern).
    causal: position i attends to positions j <= i only (the kernel's own causal mask).

  Returns:
    ``[B, L, H, K]`` in q's dtype.

  Raises:
    ValueError: if N != L.
    NotImplementedError, ValueError: from the kernel's checks at trace time (e.g. a head dim
      above 128 that is not a multiple of 128). Mosaic's compiler checks more (e.g. it
      rejects float16) when the step is compiled for a TPU, after the module has chosen.

  The kernel lowers to a Mosaic ``tpu_custom_call``: it runs on a TPU, or on a CPU inside
  ``jax.experimental.pallas.tpu.force_tpu_interpret_mode()`` (tests).
  """
  # Imported here: the Pallas TPU modules are needed only when compiling for a TPU.
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
  """Multi-head softmax self-attention.

  Fields: :class:`base.Attention`'s ``num_heads`` (H), ``qkv_dim`` (D, over all heads),
  ``out_dim`` (O), ``use_bias`` and ``dense_init`` (of the ``query``, ``key``, ``value`` and
  ``out`` projections), then ``dropout_rate``, ``dtype`` and its own options:

  Attributes:
    dropout_rate: dropout on the attention weights (LRA's
      ``attention_dropout_rate``); only ``einsum`` has it, so with dropout active the
      other implementations fall back to ``einsum``.
    causal: if True, position i attends to positions j <= i only.
    implementation: ``"einsum"`` (default), ``"xla"`` or ``"flash"`` (module docstring):
      ``flash`` is cuDNN flash attention on a GPU and the Pallas TPU flash-attention kernel
      on a TPU (the platform of :func:`base.target_platform` when the module is traced),
      elsewhere ``xla`` with a logged reason; ``"fused"`` is an alias of ``"xla"`` and
      ``"cudnn"`` of ``"flash"`` (the TPU kernel on a TPU too).
    num_queries: 0 (default): outputs at every position. N > 0: outputs at the first N
      positions only, ``y_BxNxO``, while keys and values still cover all L positions
      (the encoder's last block with CLS pooling).
    lra_masking: False (default): a query attends to the real keys, whether or not it is a
      pad itself. True: LRA's mask (flax.deprecated ``SelfAttention`` with ``padding_mask``,
      ``models/transformer/transformer.py``), query AND key, so a pad query has every key
      masked and spreads its weight evenly over all L positions, pads included. Outputs at
      real positions are the same either way; the pad rows differ, which matters only where
      they are read: LRA's MEAN pooling over pads (``model.lra_mean_over_pads``).
    dtype: computation dtype.

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO`` (``y_BxNxO``
  with ``num_queries``). Keys at padded positions get zero weight, so outputs at real
  positions do not depend on padding. Applied with ``mutable=[base.MAPS]``, it sows its
  weights ``[B, H, N, L]`` (:func:`softmax_weights`, whatever the implementation) as
  ``"map"`` (:func:`base.sow_map`).

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
      # One query row (the CLS-only last block) needs no flash kernel: its logits are [B, H, N, L].
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
    """``[B, 1, N, L]`` bool: real keys (and real queries with ``lra_masking``), and
    ``j <= i`` when causal."""
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
