"""SimpleAttention: softmax-free attention in linear time and memory.

Yorsh et al., "SimpleTRON: Simple Transformer with O(N) Complexity"
(2021/2022). Per head::

    SimpleAttention(Q, K, V) = Q (K^T V) / sqrt(L)

with ``Q = X W_q + b_q`` and likewise K, V. ``K^T V`` is formed first, so the
cost is O(L d^2) time and O(L d) memory; no softmax and no 1/sqrt(d) term.
``L`` is each example's number of real tokens (CLS included), not the padded
length: padded positions are zeroed in Q, K and V and so drop out of
``K^T V`` (the authors' later fixed code masks q, k and v).

The function behind the published numbers is reachable by options (docs/fidelity.md;
the authors' ``SimpleAttention`` in ``vladyorsh/lra_efficient_transformers``,
``lra/notebooks/listops_setup_simple_2.ipynb``): ``normalizer="padded"`` divides by
``sqrt`` of the padded length ``x.shape[1]`` (a constant ``max_length + 1`` when every
batch is padded to ``max_length``), ``mask_pads=False`` lets the pads enter ``K^T V``, and
``kv_dropout_rate=0.1`` drops out entries of ``K^T V``. The authors computed
``Q dropout(K^T V / sqrt(L))``; dropout scales entries, so that equals the
``Q dropout(K^T V) / sqrt(L)`` computed here.

Paper Table 1 variants are built from this one module, registered at the end of this file:
``simple`` has no output projection and
needs ``qkv_dim == out_dim``; ``simple_res`` adds the encoder's double skip;
``simple_resl`` adds the output projection back.
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
  """Non-causal SimpleAttention on projected heads.

  Args:
    q_BxLxHxK, k_BxLxHxK, v_BxLxHxK: per-head queries, keys, values.
    mask_BxL: bool, True for real tokens.
    normalizer: ``"real"``: divide by ``sqrt`` of each example's number of real tokens;
      ``"padded"``: by ``sqrt(L)``, the padded length (the authors' code).
    mask_pads: True zeroes Q, K and V at pads, so pads stay out of ``K^T V``; False lets
      them in (the authors' code).
    kv_dropout: optional callable applied to ``K^T V`` (``[B, H, K, K]``), e.g. dropout.
    block_diagonal: True: both products run on the heads side by side, ``[B, L, H*K]``,
      with every head's ``K^T V`` a block of one ``[B, H*K, H*K]`` matrix whose other
      blocks are zeroed. The zero blocks add exact zeros, so the function is the same (not
      bit-identical: the sums group differently). The products cost ``H`` times the FLOPs
      of the per-head ones, but no array of ``L`` rows is transposed, forward or backward.
      With it, :class:`SimpleAttention` projects Q, K and V flat
      (:class:`base.HeadProjection`). Its speed on a GPU and CPU: docs/fast_paths.md.

  Returns:
    ``[B, L, H, K]``; rows at padded positions are 0 when ``mask_pads``. No ``L x L``
    array is built: the largest intermediate is ``K^T V`` of shape ``[B, H, K, K]``.

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
  """:func:`simple_attention` with ``block_diagonal=True`` (same arguments and result).

  Pads are kept out by zeroing K alone (a zero key row adds nothing to ``K^T V``, whatever
  the value row) and the output rows, in the normalizing pass that runs anyway: at real
  positions the same numbers, one masking pass over ``[B, L, D]`` instead of three.
  """
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
  """Causal SimpleAttention: ``y_i = q_i (sum_{j<=i} k_j^T v_j) / sqrt(n_i)``.

  ``n_i`` is the number of real tokens at positions ``<= i``. The sequence is
  split into chunks of ``chunk_size`` tokens: inside a chunk the masked
  ``[C, C]`` product is used, across chunks an exclusive prefix sum of
  per-chunk ``K^T V`` states (``[B, L/C, H, K, K]``), so memory stays linear
  in L for a fixed chunk size.

  Args:
    q_BxLxHxK, k_BxLxHxK, v_BxLxHxK: per-head queries, keys, values.
    mask_BxL: bool, True for real tokens.
    chunk_size: C in tokens.
    normalizer: ``"real"`` (``n_i`` as above) or ``"padded"`` (``n_i = i + 1``, every
      position counted, the causal analogue of the authors' constant).
    mask_pads: False lets pads enter the prefix sums (the authors' code).

  Returns:
    ``[B, L, H, K]``.

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
  """The exact token-to-token map of SimpleAttention, formed explicitly (for one example).

  SimpleAttention never forms it: ``Q (K^T V) / sqrt(L)`` equals ``A V`` with
  ``A_ij = q_i . k_j / sqrt(L)`` per head (Yorsh et al.), which this returns, with the masking
  and normalizer of :func:`simple_attention` (non-causal) or :func:`causal_simple_attention`
  (``causal``: ``j <= i`` and ``sqrt(n_i)``). With it, the per-head output of those functions
  is ``einsum("bhij,bjhk->bihk", A, v)`` for the unmasked ``v`` (pads get zero weight when
  ``mask_pads``). Quadratic in L: the module computes it only when asked
  (:func:`base.sow_map`); ``simpletron_jax.tools.explain`` reads it.

  Args:
    q_BxLxHxK, k_BxLxHxK: per-head queries and keys as projected.
    mask_BxL: bool, True for real tokens.
    normalizer, mask_pads: as in :func:`simple_attention`.
    causal: the causal form's map.

  Returns:
    ``[B, H, L, L]`` float, signed (no softmax: rows need not sum to 1).

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
  """Multi-head SimpleAttention (SimpleTRON, Yorsh et al.).

  Fields: :class:`base.Attention`'s ``num_heads`` (H), ``qkv_dim`` (D, over all heads),
  ``out_dim`` (O; without the output projection the concatenated heads are the output, so
  ``qkv_dim`` must equal it), ``use_bias`` and ``dense_init`` (of the ``query``, ``key``,
  ``value`` and ``out`` projections), then ``dropout_rate``, ``dtype`` and its own options:

  Attributes:
    dropout_rate: unused; there is no attention-weight matrix to drop out.
      Kept so every variant takes the same arguments.
    use_output_proj: False for paper variants Simple and Simple-Res, True for
      Simple-ResL.
    causal: if True, position i sees positions j <= i only.
    chunk_size: chunk length in tokens for the causal form.
    normalizer: ``"real"`` (default): ``L`` is each example's number of real tokens,
      CLS included; ``"padded"``: ``L`` is the padded length ``x.shape[1]``, which is
      ``model.max_length + 1`` when ``data.bucket=0`` (the authors' code). Causal:
      ``n_i = i + 1``.
    mask_pads: True (default) zeroes Q, K, V at pads; False lets pads enter ``K^T V``
      as the authors' code did (outputs then depend on the padding).
    kv_dropout_rate: dropout on the entries of ``K^T V`` in training (the authors used
      0.1); 0 (default): none. Non-causal only.
    block_diagonal: run the products on ``[B, L, H*K]`` with the heads' ``K^T V`` as the
      blocks of one block-diagonal matrix (see :func:`simple_attention`; the same function,
      ``H`` times the attention FLOPs, no transposes; not bit-identical), and the Q, K, V
      projections as flat matmuls with a flat bias (:class:`base.HeadProjection`, the same
      parameters). Non-causal only.
    dtype: computation dtype.

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``. Applied with
  ``mutable=[base.MAPS]``, it sows the exact map it never forms, :func:`simple_map`
  ``[B, H, L, L]``, as ``"map"`` (:func:`base.sow_map`).

  Raises:
    ValueError: if ``use_output_proj`` is False and ``qkv_dim != out_dim``
      (config fields ``model.qkv_dim`` and ``model.emb_dim``); for an unknown
      ``normalizer``; for ``kv_dropout_rate > 0`` with ``causal`` (the causal form has
      one ``K^T V`` state per chunk, not one per sequence), or ``block_diagonal`` with
      ``causal``; each naming its ``model.attention_kwargs`` field.
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


# Paper Table 1: Simple and Simple-Res have no output projection, Simple-Res and Simple-ResL
# the double skip. Simple is exact under length padding only with the pads masked and the
# real-token count as the normaliser.
for _name, _output_proj, _double in (("simple", False, False), ("simple_res", False, True),
                                     ("simple_resl", True, True)):
  registry.register(registry.AttentionSpec(
      _name, SimpleAttention, {"use_output_proj": _output_proj}, double_skip=_double,
      paper="Yorsh et al., SimpleTRON (2021)", length_padding_exact=True,
      padding_exact_options={"normalizer": "real", "mask_pads": True},
      output_projection=_output_proj))
