"""Performer attention (FAVOR+) with random or deterministic feature maps.

Choromanski et al., "Rethinking Attention with Performers" (ICLR 2021). Per
head, attention is approximated by a feature map ``phi`` and renormalised::

    out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j))

Kernels (field ``kernel``):

* ``"softmax"``: positive orthogonal random features (FAVOR+),
  ``phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(M)`` with ``x' = x / d^(1/4)``, so
  that ``E[phi(q)^T phi(k)] = exp(q^T k / sqrt(d))``, the softmax kernel.
  ``W`` is ``[M, d]``: blocks of ``d`` orthonormal rows from the QR
  decomposition of Gaussian matrices, each row rescaled by an independent
  chi(d)-distributed norm (the norm of a Gaussian vector), so every row is
  marginally Gaussian. A per-query and a per-(example, head) key maximum of
  ``W x'`` is subtracted in the exponent (it cancels in the ratio), a small
  ``softmax_eps`` is added to the features and guards a tiny renormaliser, as in
  the paper's code and LRA's ``models/performer/performer_attention.py``. LRA's
  ListOps run drew ``W`` anew on every call from the sum of the queries: option
  ``lra_bugs``.
* ``"relu"``: the generalized kernel with random features,
  ``phi(x) = relu(W x) + relu_eps``.
* ``"relu_deterministic"``: ``phi(x) = relu(x) + relu_eps`` with no
  projection. This is what LRA's "Performer" runs (its
  ``make_fast_generalized_attention`` default ``features_type='deterministic'``,
  ``kernel_epsilon=0.001``).

Padded keys are removed AFTER the feature map (``phi`` of a zero vector is not
zero), so padding never changes outputs at real positions; LRA's Performer
does not do this.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from simpletron_jax.model.attention import base, registry
from simpletron_jax.model.attention.linear import (feature_attention_map,
                                                   normalized_feature_attention)

KERNELS = ("softmax", "relu", "relu_deterministic")


@functools.partial(jax.jit, static_argnums=(1, 2))
def gaussian_orthogonal_random_matrix(key: jax.Array, num_features: int, dim: int) -> jnp.ndarray:
  """Draws FAVOR+'s orthogonal random projection (Choromanski et al., 2021, sec. 2.4).

  Rows come in blocks of ``dim`` mutually orthogonal directions (the Q factor
  of the QR decomposition of a ``[dim, dim]`` standard Gaussian matrix, with
  the sign fix that makes it Haar-distributed); the last block is truncated
  to reach ``num_features`` rows. Each row is then scaled to the norm of an
  independent ``dim``-dimensional standard Gaussian vector (chi(dim)), so
  every row is marginally ``N(0, I_dim)`` while rows within a block stay
  orthogonal.

  Args:
    key: a PRNG key.
    num_features: M, the number of random features (positive).
    dim: d, the per-head query/key width (positive).

  Returns:
    ``W_MxD``, float32 of shape ``[num_features, dim]``.

  Raises:
    ValueError: if ``num_features`` or ``dim`` is not positive (config field
      ``model.attention_kwargs.num_features``).

  Jitted with ``num_features`` and ``dim`` static (one compilation per shape).
  """
  if num_features <= 0 or dim <= 0:
    raise ValueError(f"model.attention_kwargs.num_features={num_features} and head width "
                     f"{dim} must be positive")
  n_blocks = -(-num_features // dim)
  # One draw (one threefry kernel): the block matrices, then the norm vectors.
  g = jax.random.normal(key, (n_blocks * dim + num_features, dim), jnp.float32)
  g_NxDxD = g[:n_blocks * dim].reshape(n_blocks, dim, dim)
  q_NxDxD, r_NxDxD = jnp.linalg.qr(g_NxDxD)
  signs_NxD = jnp.sign(jnp.diagonal(r_NxDxD, axis1=-2, axis2=-1))
  signs_NxD = jnp.where(signs_NxD == 0, 1.0, signs_NxD)
  q_NxDxD = q_NxDxD * signs_NxD[:, None, :]
  # Columns of each Q are orthonormal; transposed, they are the rows of a block.
  w_MxD = jnp.swapaxes(q_NxDxD, 1, 2).reshape(n_blocks * dim, dim)[:num_features]
  norms_M = jnp.linalg.norm(g[n_blocks * dim:], axis=-1)
  return w_MxD * norms_M[:, None]


def lra_orthogonal_random_matrix(key: jax.Array, num_features: int, dim: int) -> jnp.ndarray:
  """The FAVOR+ projection as LRA draws it from ``key`` (with ``lra_bugs``).

  LRA's ``models/performer/performer_attention.py`` (``draw_weights`` and
  ``GaussianOrthogonalRandomMatrix`` with ``scaling=0``): the key is split once and its
  first half ``k0`` drives everything; each block of ``dim`` rows is the transposed Q factor
  of the QR decomposition of a ``[dim, dim]`` standard Gaussian drawn from a key split off
  ``k0`` in turn (no sign fix, so the blocks are not exactly Haar); the last block is
  truncated to reach ``num_features`` rows; row ``i`` is scaled by the norm of row ``i`` of
  a ``[num_features, dim]`` Gaussian drawn from ``k0`` itself. The random bits are jax's
  non-partitionable threefry (``jax.threefry_partitionable(False)``), the default of the
  jax LRA ran with, so the same key gives LRA's numbers.

  Args:
    key: a PRNG key (raw ``uint32[2]``).
    num_features: M (positive).
    dim: d, the per-head query/key width (positive).

  Returns:
    ``W_MxD``, float32 ``[num_features, dim]``.

  Raises:
    ValueError: if ``num_features`` or ``dim`` is not positive (config field
      ``model.attention_kwargs.num_features``).
  """
  if num_features <= 0 or dim <= 0:
    raise ValueError(f"model.attention_kwargs.num_features={num_features} and head width "
                     f"{dim} must be positive")
  with jax.threefry_partitionable(False):
    k0, _ = jax.random.split(key)
    rng = k0
    blocks = []
    for start in range(0, num_features, dim):
      rng, sub = jax.random.split(rng)
      q_DxD, _ = jnp.linalg.qr(jax.random.normal(sub, (dim, dim), jnp.float32))
      blocks.append(q_DxD.T[:min(dim, num_features - start)])
    norms_M = jnp.linalg.norm(jax.random.normal(k0, (num_features, dim), jnp.float32), axis=1)
  return norms_M[:, None] * jnp.concatenate(blocks, axis=0)


def lra_query_seed_key(q_BxLxHxK: jnp.ndarray) -> jax.Array:
  """LRA's per-call feature key: ``PRNGKey(int32(ceil(sum(q) * 1e7)))``.

  LRA's ``models/performer/performer_attention.py`` (``redraw_features=True``, the default of
  ``make_fast_softmax_attention``) seeds each call's projection with the sum of ALL the
  queries of the batch, so the features change with the batch, its padding and the
  parameters, in training and evaluation alike. The float-to-int32 conversion saturates
  (XLA's), as it did in LRA's runs.

  Args:
    q_BxLxHxK: the projected queries; summed in float32.

  Returns:
    A raw ``uint32[2]`` key.
  """
  total = jnp.sum(q_BxLxHxK.astype(jnp.float32))
  seed = jax.lax.convert_element_type(jnp.ceil(total * 10000000.0), jnp.int32)
  with jax.threefry_partitionable(False):
    return jax.random.PRNGKey(seed)


def softmax_kernel_features(x_BxLxHxK, w_MxK, mask_BxL, *, is_query: bool, eps: float):
  """FAVOR+ positive random features for the softmax kernel.

  ``phi(x) = (exp(W x' - |x'|^2/2 - c) + eps) / sqrt(M)``, ``x' = x d^(-1/4)``
  (Choromanski et al., 2021, Lemma 1). The stabiliser ``c`` is LRA's
  (``models/performer/performer_attention.py``,
  ``nonnegative_softmax_kernel_feature_creator``, as in the Performer authors' code): the
  maximum of ``W x'`` (without the ``|x'|^2/2`` term) over the M features of each query, or
  for keys over the real positions and the features of each (example, head). Constant
  along the sums it enters, it cancels in the renormalised attention when ``eps = 0``; with
  ``eps > 0`` it sets how much ``eps`` weighs, so it is LRA's exactly, gradient included.

  Args:
    x_BxLxHxK: float32 queries or keys.
    w_MxK: the projection from :func:`gaussian_orthogonal_random_matrix`.
    mask_BxL: bool, True for real tokens; for keys only real positions set
      the stabiliser and padded positions get ``exp(.) = 0``.
    is_query: selects the stabiliser.
    eps: FAVOR+'s numerical stabiliser added to every feature.

  Returns:
    ``[B, L, H, M]`` non-negative features.
  """
  num_features, head_dim = w_MxK.shape
  x_BxLxHxK = x_BxLxHxK * head_dim ** -0.25
  wx_BxLxHxM = jnp.einsum("blhk,mk->blhm", x_BxLxHxK, w_MxK)
  half_sq_BxLxHx1 = 0.5 * jnp.sum(jnp.square(x_BxLxHxK), axis=-1, keepdims=True)
  if is_query:
    stab_BxLxHx1 = jnp.max(wx_BxLxHxM, axis=-1, keepdims=True)
    logits_BxLxHxM = wx_BxLxHxM - half_sq_BxLxHx1 - stab_BxLxHx1
  else:
    real_BxLx1x1 = mask_BxL[:, :, None, None]
    stab_Bx1xHx1 = jnp.max(jnp.where(real_BxLx1x1, wx_BxLxHxM, -jnp.inf), axis=(1, 3),
                           keepdims=True)
    stab_Bx1xHx1 = jnp.where(jnp.isfinite(stab_Bx1xHx1), stab_Bx1xHx1, 0.0)
    logits_BxLxHxM = jnp.where(real_BxLx1x1,
                               wx_BxLxHxM - half_sq_BxLxHx1 - stab_Bx1xHx1, -jnp.inf)
  return (jnp.exp(logits_BxLxHxM) + eps) / jnp.sqrt(float(num_features))


def relu_kernel_features(x_BxLxHxK, w_MxK, *, eps: float):
  """Generalized ReLU kernel features (Choromanski et al., 2021, sec. 2.2).

  Args:
    x_BxLxHxK: float32 queries or keys.
    w_MxK: random projection, or None for the deterministic form
      ``relu(x) + eps`` (then ``M = K``).
    eps: added to every feature (LRA/Performer ``kernel_epsilon``).

  Returns:
    ``[B, L, H, M]`` positive features.
  """
  if w_MxK is not None:
    x_BxLxHxK = jnp.einsum("blhk,mk->blhm", x_BxLxHxK, w_MxK)
  return jax.nn.relu(x_BxLxHxK) + eps


class PerformerAttention(base.Attention):
  """Multi-head Performer attention (FAVOR+, Choromanski et al., 2021); non-causal.

  Fields: :class:`base.Attention`'s ``num_heads`` (H), ``qkv_dim`` (D, over all heads),
  ``out_dim`` (O), ``use_bias`` and ``dense_init`` (of the ``query``, ``key``, ``value`` and
  ``out`` projections), then ``dropout_rate``, ``dtype`` and its own options:

  Attributes:
    dropout_rate: unused: FAVOR+ forms no attention weights to drop out (it sums the
      features' ``phi(K)^T V``); kept so every variant takes the same arguments.
    kernel: ``"softmax"`` (FAVOR+ positive orthogonal random features),
      ``"relu"`` (generalized ReLU kernel with random features) or
      ``"relu_deterministic"`` (LRA's default Performer: ``relu(x)``, no
      projection).
    num_features: M, the number of random features (random kernels only).
    redraw: if False the projection is drawn once from ``feature_seed``. If
      True, in training mode (``deterministic=False``) a new projection is
      drawn on every call from the ``"random_features"`` rng collection; when
      that collection is not provided (or in deterministic mode) the fixed
      projection is used.
    feature_seed: seed of the fixed projection ``jax.random.PRNGKey(feature_seed)``.
      The matrix is a constant, not a parameter: it is recomputed at trace
      time and is the same in every run with the same seed.
    softmax_eps: FAVOR+'s numerical stabiliser for the softmax kernel: added to every
      feature, and ``2 * softmax_eps`` is added to a renormaliser whose absolute value is
      at most ``softmax_eps`` (LRA's ``make_fast_softmax_attention``
      ``numerical_stabilizer``, 1e-6).
    relu_eps: the epsilon added to ReLU features (Performer's
      ``kernel_epsilon``, 1e-3).
    lra_masking: False (default): pads are left out of the key sums and of the keys'
      stabiliser. True: LRA's ``models/performer/performer.py``, whose FAVOR+ attention
      function ignores the padding mask ``nn.SelfAttention`` passes it, so pads enter
      both (outputs then depend on the padding).
    lra_bugs: False (default): the ``"softmax"`` kernel's projection is fixed
      (``feature_seed``) or redrawn from the rng (``redraw``). True: LRA's
      ``models/performer/performer_attention.py`` as its ListOps config ran it
      (``make_fast_softmax_attention``, ``redraw_features=True``): on EVERY call, training
      and evaluation, the projection is drawn from ``PRNGKey(ceil(sum(q) * 1e7))``, the sum
      of all the batch's queries (:func:`lra_query_seed_key`), by LRA's procedure
      (:func:`lra_orthogonal_random_matrix`), so each example's output depends on the rest
      of the batch. ``redraw`` and ``feature_seed`` are then unused. No effect on the
      ``"relu"`` kernels (LRA's generalized attention never redraws).
    dtype: computation dtype of the projections; features and sums are
      float32 and cast back.

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``.
  The projection used is sown into the ``"intermediates"`` collection as
  ``projection_MxK`` (apply with ``mutable=["intermediates"]`` to read it). Applied with
  ``mutable=[base.MAPS]``, it sows the exact map of its features,
  ``linear.feature_attention_map`` ``[B, H, L, L]``, as ``"map"``.

  Raises:
    ValueError: for an unknown ``kernel`` (config field
      ``model.attention_kwargs.kernel``), a non-positive ``num_features``,
      or ``qkv_dim`` not a multiple of ``num_heads``.
  """

  kernel: str = "softmax"
  num_features: int = 256
  redraw: bool = False
  feature_seed: int = 0
  softmax_eps: float = 1e-6
  relu_eps: float = 1e-3
  lra_masking: bool = False
  lra_bugs: bool = False

  def _projection(self, q_BxLxHxK, deterministic: bool):
    """The ``[M, K]`` projection for this call, or None (deterministic kernel)."""
    head_dim = q_BxLxHxK.shape[-1]
    if self.kernel == "relu_deterministic":
      return None
    if self.lra_bugs and self.kernel == "softmax":
      return lra_orthogonal_random_matrix(lra_query_seed_key(q_BxLxHxK), self.num_features,
                                          head_dim)
    if self.redraw and not deterministic and self.has_rng("random_features"):
      return gaussian_orthogonal_random_matrix(self.make_rng("random_features"),
                                               self.num_features, head_dim)
    with jax.ensure_compile_time_eval():
      return gaussian_orthogonal_random_matrix(jax.random.PRNGKey(self.feature_seed),
                                               self.num_features, head_dim)

  @nn.compact
  def __call__(self, x_BxLxE, mask_BxL=None, *, deterministic: bool = True):
    if self.kernel not in KERNELS:
      raise ValueError(f"unknown performer kernel {self.kernel!r} "
                       f"(model.attention_kwargs.kernel); expected one of {KERNELS}")
    mask_BxL = base.lra_mask(base.default_mask(x_BxLxE, mask_BxL), self.lra_masking)
    q, k, v = self.project_qkv(x_BxLxE)
    q, k, v = q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32)
    w_MxK = self._projection(q, deterministic)
    if w_MxK is not None:
      self.sow("intermediates", "projection_MxK", w_MxK)
    if self.kernel == "softmax":
      phi_q = softmax_kernel_features(q, w_MxK, mask_BxL, is_query=True, eps=self.softmax_eps)
      phi_k = softmax_kernel_features(k, w_MxK, mask_BxL, is_query=False, eps=self.softmax_eps)
    else:
      phi_q = relu_kernel_features(q, w_MxK, eps=self.relu_eps)
      phi_k = relu_kernel_features(k, w_MxK, eps=self.relu_eps)
    # LRA's renormaliser: the softmax kernel's stabiliser also guards the denominator.
    small_den = self.softmax_eps if self.kernel == "softmax" else 0.0
    base.sow_map(self, lambda: feature_attention_map(phi_q, phi_k, mask_BxL, eps=0.0,
                                                     small_den=small_den))
    y_BxLxHxK = normalized_feature_attention(phi_q, phi_k, v, mask_BxL, eps=0.0,
                                             small_den=small_den)
    return self.project_out(y_BxLxHxK.astype(self.dtype))


registry.register(registry.AttentionSpec(
    "performer", PerformerAttention,
    paper="Choromanski et al., Rethinking Attention with Performers (2021)",
    length_padding_exact=True))
