"""Performer attention (FAVOR+, Choromanski et al., "Rethinking Attention with Performers", 2021).

``y_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j))`` per head, with the
feature map of field ``kernel``:

* ``"softmax"``: positive orthogonal random features, ``phi(x) = exp(W x' - |x'|^2 / 2) /
  sqrt(M)``, ``x' = x / d^(1/4)``, so ``E[phi(q)^T phi(k)] = exp(q^T k / sqrt(d))``; with
  LRA's stabiliser and ``softmax_eps`` (``models/performer/performer_attention.py``).
* ``"relu"``: ``relu(W x) + relu_eps``, the generalized kernel.
* ``"relu_deterministic"``: ``relu(x) + relu_eps``, no projection: what LRA's "Performer" runs
  (``make_fast_generalized_attention``, ``features_type='deterministic'``).

Pad keys are removed AFTER the feature map (``phi(0) != 0``); LRA's Performer does not mask.
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
  """FAVOR+'s orthogonal random projection ``W_MxD``, float32 ``[num_features, dim]`` (sec. 2.4).

  Blocks of ``dim`` orthogonal rows, each the Haar Q factor of a Gaussian matrix (sign-fixed),
  the last block truncated; each row scaled to an independent chi(dim) norm, so every row is
  marginally ``N(0, I)``. Jitted, ``num_features`` and ``dim`` static.

  Raises:
    ValueError: naming ``model.attention_kwargs.num_features`` unless both are positive.
  """
  if num_features <= 0 or dim <= 0:
    raise ValueError(f"model.attention_kwargs.num_features={num_features} and head width "
                     f"{dim} must be positive")
  n_blocks = -(-num_features // dim)
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
  """The FAVOR+ projection ``W_MxD`` as LRA draws it from ``key`` (``lra_bugs``).

  LRA's ``draw_weights`` / ``GaussianOrthogonalRandomMatrix`` (``scaling=0``): from the first
  half ``k0`` of ``key``, each block the transposed Q factor of a Gaussian from a key split off
  ``k0`` in turn (no sign fix), row norms from a Gaussian drawn from ``k0``; non-partitionable
  threefry, so the same key gives LRA's numbers.

  Raises:
    ValueError: naming ``model.attention_kwargs.num_features`` unless both are positive.
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
  """LRA's per-call feature key ``PRNGKey(int32(ceil(sum(q) * 1e7)))``, a raw ``uint32[2]``.

  ``q`` is every query of the batch, summed in float32; the conversion saturates as XLA's does
  (LRA's ``redraw_features=True``). docs/lra_parity.md has the check.
  """
  total = jnp.sum(q_BxLxHxK.astype(jnp.float32))
  seed = jax.lax.convert_element_type(jnp.ceil(total * 10000000.0), jnp.int32)
  with jax.threefry_partitionable(False):
    return jax.random.PRNGKey(seed)


def softmax_kernel_features(x_BxLxHxK, w_MxK, mask_BxL, *, is_query: bool, eps: float):
  """FAVOR+ positive features ``[B, L, H, M]`` for the softmax kernel (Lemma 1).

  ``phi(x) = (exp(W x' - |x'|^2/2 - c) + eps) / sqrt(M)``, ``x' = x d^(-1/4)``. The stabiliser
  ``c`` is LRA's (``nonnegative_softmax_kernel_feature_creator``): the max of ``W x'`` over a
  query's features, or over the real keys and features of each (example, head). It cancels
  when ``eps = 0``; with ``eps > 0`` it weighs ``eps``, so it is LRA's exactly.

  Args:
    x_BxLxHxK: float32 queries or keys.
    w_MxK: the projection.
    mask_BxL: bool, real tokens; pad keys get ``exp(.) = 0`` and set no stabiliser.
    is_query: selects the stabiliser.
    eps: added to every feature.
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
  """ReLU features ``[B, L, H, M]``: ``relu(W x) + eps`` (``w_MxK`` None: ``relu(x) + eps``)."""
  if w_MxK is not None:
    x_BxLxHxK = jnp.einsum("blhk,mk->blhm", x_BxLxHxK, w_MxK)
  return jax.nn.relu(x_BxLxHxK) + eps


class PerformerAttention(base.Attention):
  """Multi-head non-causal Performer attention (:class:`base.Attention`'s fields, then its own).

  Attributes:
    dropout_rate: unused (no attention weights are formed).
    kernel: ``"softmax"``, ``"relu"`` or ``"relu_deterministic"`` (module docstring).
    num_features: M, random features (random kernels only).
    redraw: True: in training, a new projection each call from the ``"random_features"`` rng
      when given; else the fixed one.
    feature_seed: the fixed projection is drawn from ``PRNGKey(feature_seed)`` at trace time
      (a constant, not a parameter).
    softmax_eps: the softmax kernel's stabiliser, on features and small renormalisers (LRA's
      ``numerical_stabilizer``, 1e-6).
    relu_eps: added to ReLU features (``kernel_epsilon``, 1e-3).
    lra_masking: True: LRA's unmasked sums and stabiliser, so outputs depend on padding.
    lra_bugs: True (``"softmax"`` only): LRA's ListOps run, the projection drawn on EVERY call
      from the batch's queries (:func:`lra_query_seed_key`, :func:`lra_orthogonal_random_matrix`);
      ``redraw`` and ``feature_seed`` unused.

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``; features and sums
  in float32. Sows the projection as ``intermediates/projection_MxK`` and
  :func:`linear.feature_attention_map` as the map.

  Raises:
    ValueError: unknown ``kernel`` (``model.attention_kwargs.kernel``), non-positive
      ``num_features``, or bad ``qkv_dim``.
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
