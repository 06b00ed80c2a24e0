"""SimpleAttention (Yorsh et al., "SimpleTRON: Simple Transformer with O(N) Complexity").

``Q (K^T V) / sqrt(L)`` per head, ``K^T V`` first: O(L d^2) time, O(L d) memory, no softmax.
``L`` is each example's count of real tokens (CLS included); pads are zeroed in Q, K and V.
The authors' function (``lra/notebooks/listops_setup_simple_2.ipynb``) is reachable by
options, docs/fidelity.md: ``normalizer="padded"``, ``mask_pads=False``,
``kv_dropout_rate=0.1`` (``Q dropout(K^T V) / sqrt(L)``, equal to their
``Q dropout(K^T V / sqrt(L))`` as dropout scales entries). Paper Table 1's ``simple``,
``simple_res`` and ``simple_resl`` are registered at the end.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from simpletron_jax.model.attention import base, registry


NORMALIZERS = ("real", "padded")


def _check_normalizer(normalizer: str) -> None:
  if normalizer not in NORMALIZERS:
    raise ValueError(f"model.attention_kwargs.normalizer={normalizer!r}; expected one of "
                     f"{NORMALIZERS}")


def simple_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask_BxL, *, normalizer: str = "real",
                     mask_pads: bool = True, kv_dropout=None, block_diagonal: bool = False):
  """Non-causal SimpleAttention ``[B, L, H, K]`` on projected heads; largest array ``[B, H, K, K]``.

  Args:
    q_BxLxHxK, k_BxLxHxK, v_BxLxHxK: per-head queries, keys, values.
    mask_BxL: bool, True for real tokens.
    normalizer: ``"real"``: ``sqrt`` of each example's real tokens; ``"padded"``: of L.
    mask_pads: zero Q, K and V at pads (pad rows of the output are then 0).
    kv_dropout: optional callable on ``K^T V`` ``[B, H, K, K]``.
    block_diagonal: the products on ``[B, L, H*K]``, each head's ``K^T V`` a block of one
      ``[B, H*K, H*K]`` matrix with zeroed other blocks: the same function (not
      bit-identical), H times the FLOPs, no transposes of L-row arrays
      (docs/fast_paths.md).

  Raises:
    ValueError: for an unknown ``normalizer``.
  """
  _check_normalizer(normalizer)
  if block_diagonal:
    return _block_diagonal_simple(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask_BxL, normalizer,
                                  mask_pads, kv_dropout)
  q, k, v = q_BxLxHxK, k_BxLxHxK, v_BxLxHxK
  if mask_pads:
    m = mask_BxL[:, :, None, None].astype(q.dtype)
    q, k, v = q * m, k * m, v * m
  kv_BxHxKxK = jnp.einsum("blhd,blhe->bhde", k, v)
  if kv_dropout is not None:
    kv_BxHxKxK = kv_dropout(kv_BxHxKxK)
  y = jnp.einsum("blhd,bhde->blhe", q, kv_BxHxKxK)
  if normalizer == "padded":
    y = y / jnp.sqrt(jnp.asarray(q_BxLxHxK.shape[1], y.dtype))
  else:
    n_B = jnp.maximum(mask_BxL.sum(axis=-1), 1).astype(y.dtype)
    y = y / jnp.sqrt(n_B)[:, None, None, None]
  return y


def _block_diagonal_simple(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask_BxL, normalizer: str,
                           mask_pads: bool, kv_dropout):
  """:func:`simple_attention` with ``block_diagonal``; pads out by zeroing K and output rows."""
  b, l, h, kd = q_BxLxHxK.shape
  q, k, v = (t.reshape(*t.shape[:2], h * kd) for t in (q_BxLxHxK, k_BxLxHxK, v_BxLxHxK))
  m = mask_BxL[:, :, None].astype(q.dtype)
  if mask_pads:
    k = k * m
  kv_BxDxD = jnp.einsum("bld,ble->bde", k, v)
  head = np.arange(h * kd) // kd
  kv_BxDxD = jnp.where(head[:, None] == head[None, :], kv_BxDxD, 0)
  if kv_dropout is not None:   # drops each head's K^T V entries, as the per-head form does
    kv_BxHxKxK = jnp.einsum("bhdhe->bhde", kv_BxDxD.reshape(b, h, kd, h, kd))
    kv_BxHxKxK = kv_dropout(kv_BxHxKxK)
    kv_BxDxD = jnp.einsum("bhde,hg->bhdge", kv_BxHxKxK, jnp.eye(h, dtype=kv_BxDxD.dtype)
                          ).reshape(b, h * kd, h * kd)
  y = jnp.einsum("bld,bde->ble", q, kv_BxDxD)
  if normalizer == "padded":
    y = y / jnp.sqrt(jnp.asarray(l, y.dtype))
  else:
    n_B = jnp.maximum(mask_BxL.sum(axis=-1), 1).astype(y.dtype)
    y = y / jnp.sqrt(n_B)[:, None, None]
  if mask_pads:
    y = y * m
  return y.reshape(b, l, h, kd)


def causal_simple_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask_BxL, chunk_size: int, *,
                            normalizer: str = "real", mask_pads: bool = True):
  """Causal SimpleAttention ``[B, L, H, K]``: ``y_i = q_i (sum_{j<=i} k_j^T v_j) / sqrt(n_i)``.

  ``n_i`` is the real tokens at positions ``<= i`` (``"padded"``: ``i + 1``). Chunks of
  ``chunk_size`` tokens: a masked ``[C, C]`` product inside, an exclusive prefix sum of the
  chunks' ``K^T V`` across, so memory is linear in L. ``mask_pads=False`` lets pads in.

  Raises:
    ValueError: for an unknown ``normalizer``.
  """
  _check_normalizer(normalizer)
  b, length, h, d = q_BxLxHxK.shape
  c = min(chunk_size, length)
  n_chunks = -(-length // c)
  pad = n_chunks * c - length
  m = mask_BxL.astype(q_BxLxHxK.dtype)
  if normalizer == "padded":
    m = jnp.ones_like(m)
  count_BxL = jnp.maximum(jnp.cumsum(m, axis=1), 1.0)
  m_BxLx1x1 = m[:, :, None, None] if mask_pads else jnp.ones_like(m)[:, :, None, None]

  def chunked(t):
    t = jnp.pad(t * m_BxLx1x1, ((0, 0), (0, pad), (0, 0), (0, 0)))
    return t.reshape(b, n_chunks, c, h, d)

  q, k, v = chunked(q_BxLxHxK), chunked(k_BxLxHxK), chunked(v_BxLxHxK)
  kv_BxNxHxKxK = jnp.einsum("bnchd,bnche->bnhde", k, v)
  prefix_BxNxHxKxK = jnp.cumsum(kv_BxNxHxKxK, axis=1) - kv_BxNxHxKxK
  inter = jnp.einsum("bnchd,bnhde->bnche", q, prefix_BxNxHxKxK)
  scores_BxNxHxCxC = jnp.einsum("bnqhd,bnkhd->bnhqk", q, k)
  scores_BxNxHxCxC = scores_BxNxHxCxC * jnp.tril(jnp.ones((c, c), q.dtype))
  intra = jnp.einsum("bnhqk,bnkhe->bnqhe", scores_BxNxHxCxC, v)
  y = (inter + intra).reshape(b, n_chunks * c, h, d)[:, :length]
  return y / jnp.sqrt(count_BxL)[:, :, None, None]


def simple_map(q_BxLxHxK, k_BxLxHxK, mask_BxL, *, normalizer: str = "real",
               mask_pads: bool = True, causal: bool = False):
  """The ``[B, H, L, L]`` map ``A_ij = q_i . k_j / sqrt(L)`` that SimpleAttention never forms.

  With the masking and normalizer of :func:`simple_attention` (or, ``causal``,
  :func:`causal_simple_attention`), their output is ``einsum("bhij,bjhk->bihk", A, v)``. Signed,
  rows need not sum to 1. Quadratic: built only on request (:func:`base.sow_map`).

  Raises:
    ValueError: for an unknown ``normalizer``.
  """
  _check_normalizer(normalizer)
  length = q_BxLxHxK.shape[1]
  m = mask_BxL.astype(q_BxLxHxK.dtype)
  if causal:
    counted = jnp.ones_like(m) if normalizer == "padded" else m
    keep = counted if mask_pads else jnp.ones_like(m)   # causal_simple_attention's masking
    norm_BxL = jnp.sqrt(jnp.maximum(jnp.cumsum(counted, axis=1), 1.0))
  else:
    keep = m if mask_pads else jnp.ones_like(m)
    n = (jnp.full(m.shape[:1], length, m.dtype) if normalizer == "padded"
         else jnp.maximum(mask_BxL.sum(axis=-1), 1).astype(m.dtype))
    norm_BxL = jnp.broadcast_to(jnp.sqrt(n)[:, None], m.shape)
  q = q_BxLxHxK * keep[:, :, None, None]
  k = k_BxLxHxK * keep[:, :, None, None]
  a_BxHxLxL = jnp.einsum("bihd,bjhd->bhij", q, k) / norm_BxL[:, None, :, None]
  if causal:
    a_BxHxLxL = a_BxHxLxL * jnp.tril(jnp.ones((length, length), a_BxHxLxL.dtype))
  return a_BxHxLxL


class SimpleAttention(base.Attention):
  """Multi-head SimpleAttention (:class:`base.Attention`'s fields, then its own).

  Without the output projection the concatenated heads are the output, so ``qkv_dim`` must
  equal ``out_dim``.

  Attributes:
    dropout_rate: unused (no attention weights are formed).
    use_output_proj: True for Simple-ResL only.
    causal: position i sees positions j <= i only.
    chunk_size: chunk length in tokens for the causal form.
    normalizer: ``"real"`` (default) or ``"padded"`` (``x.shape[1]``, ``max_length + 1`` with
      ``data.bucket=0``: the authors').
    mask_pads: False: pads enter ``K^T V`` (the authors'; outputs depend on padding).
    kv_dropout_rate: dropout on ``K^T V`` in training (the authors' 0.1); non-causal only.
    block_diagonal: see :func:`simple_attention`; Q, K, V projected by
      :class:`base.HeadProjection`. Non-causal only.

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``. Sows
  :func:`simple_map` as the map.

  Raises:
    ValueError: naming its field: ``qkv_dim != out_dim`` without the projection, an unknown
      ``normalizer``, ``kv_dropout_rate > 0`` or ``block_diagonal`` with ``causal``.
  """

  use_output_proj: bool = False
  causal: bool = False
  chunk_size: int = 128
  normalizer: str = "real"
  mask_pads: bool = True
  kv_dropout_rate: float = 0.0
  block_diagonal: bool = False

  @nn.compact
  def __call__(self, x_BxLxE, mask_BxL=None, *, deterministic: bool = True):
    if self.causal and self.kv_dropout_rate > 0:
      raise ValueError("model.attention_kwargs.kv_dropout_rate > 0 needs causal=False: the "
                       "causal form has no single K^T V to drop out")
    if self.causal and self.block_diagonal:
      raise ValueError("model.attention_kwargs.block_diagonal=True needs causal=False: the "
                       "causal form keeps its own chunked layout")
    if not self.use_output_proj and self.qkv_dim != self.out_dim:
      raise ValueError(
          f"attention 'simple' and 'simple_res' have no output projection, so "
          f"model.qkv_dim ({self.qkv_dim}) must equal model.emb_dim ({self.out_dim}); "
          "use attention 'simple_resl' for a different qkv_dim")
    mask_BxL = base.default_mask(x_BxLxE, mask_BxL)
    q, k, v = self.project_qkv(x_BxLxE, flat=self.block_diagonal)
    base.sow_map(self, lambda: simple_map(q, k, mask_BxL, normalizer=self.normalizer,
                                          mask_pads=self.mask_pads, causal=self.causal))
    if self.causal:
      y_BxLxHxK = causal_simple_attention(q, k, v, mask_BxL, self.chunk_size,
                                          normalizer=self.normalizer, mask_pads=self.mask_pads)
    else:
      kv_dropout = None
      if self.kv_dropout_rate > 0:
        kv_dropout = functools.partial(nn.Dropout(self.kv_dropout_rate, name="kv_dropout"),
                                       deterministic=deterministic)
      y_BxLxHxK = simple_attention(q, k, v, mask_BxL, normalizer=self.normalizer,
                                   mask_pads=self.mask_pads, kv_dropout=kv_dropout,
                                   block_diagonal=self.block_diagonal)
    if self.use_output_proj:
      return self.project_out(y_BxLxHxK)
    return y_BxLxHxK.reshape(*y_BxLxHxK.shape[:2], self.qkv_dim)


# Paper Table 1. Exact under length padding only with pads masked and the real-token normaliser.
for _name, _output_proj, _double in (("simple", False, False), ("simple_res", False, True),
                                     ("simple_resl", True, True)):
  registry.register(registry.AttentionSpec(
      _name, SimpleAttention, {"use_output_proj": _output_proj}, double_skip=_double,
      paper="Yorsh et al., SimpleTRON (2021)", length_padding_exact=True,
      padding_exact_options={"normalizer": "real", "mask_pads": True},
      output_projection=_output_proj))
