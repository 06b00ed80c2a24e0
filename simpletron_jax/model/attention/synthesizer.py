"""Synthesizer attention (Tay et al., ICML 2021): weights synthesised without token-token products.

LRA's "Synthesizer" (``models/synthesizer/synthesizer_attention.py``). Per head,
``Y_h = softmax(B_h) V_h`` over real keys, quadratic, non-causal:

* Dense (``synthesizer``): ``B_h[i] = W2_h relu(W1 x_i + b1)_h + b2_h``, ``W2_h``: K ->
  ``max_length`` sliced to the first L keys. ``W2`` is per head (LRA's shares it and mixes
  heads and positions by a reshape).
* Random (``synthesizer_random``): ``B_h = R_h[:L, :L]``, ``R`` ``[H, max_length, max_length]``
  learned, Xavier-uniform over the whole array as LRA's; or ``R1_h R2_h`` of rank
  ``factorized_rank``; or, ``trainable=False``, fixed ``N(0, 1)`` rows drawn per call.

``dot_product=True`` adds ``Q K^T / sqrt(d)`` to ``B`` (the paper's "+ Vanilla"), which is
what LRA ran (docs/lra_parity.md). Pad keys get zero weight and real keys' logits depend only
on the query and the key position, so padding changes nothing. Set
``model.attention_kwargs.max_length = model.max_length + 1``.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from simpletron_jax.model.attention import base, registry

NEG = -1e30


def _values_and_dots(module: base.Attention, x_BxLxE):
  """``(v_BxLxHxK, Q K^T / sqrt(d) [B, H, L, L] or 0)`` with ``module``'s projections."""
  if not module.dot_product:
    return module.project_heads(x_BxLxE, "value"), 0.0
  q, k, v = module.project_qkv(x_BxLxE)
  q = q / jnp.sqrt(q.shape[-1]).astype(module.dtype)
  return v, jnp.einsum("bihk,bjhk->bhij", q, k)


def synthetic_attention(logits_BxHxLxL, v_BxLxHxK, mask_BxL, dropout: nn.Module,
                        deterministic: bool, dtype, lra_pad_queries: bool = False
                        ) -> jnp.ndarray:
  """``softmax(B) V`` ``[B, L, H, K]``, pad keys masked, the softmax in float32 cast to ``dtype``.

  ``logits_BxHxLxL`` (a ``[1, H, L, L]`` batch broadcasts) are query rows by key columns;
  ``dropout`` acts on the weights. ``lra_pad_queries``: a pad query weighs every key evenly,
  as LRA's ``-1e10`` query-and-key mask does.
  """
  logits = jnp.where(mask_BxL[:, None, None, :], logits_BxHxLxL.astype(jnp.float32), NEG)
  if lra_pad_queries:   # LRA: a pad query's row is all -1e10, i.e. uniform over every key
    logits = jnp.where(mask_BxL[:, None, :, None], logits, 0.0)
  weights_BxHxLxL = jax.nn.softmax(logits, axis=-1).astype(dtype)
  weights_BxHxLxL = dropout(weights_BxHxLxL, deterministic=deterministic)
  return jnp.einsum("bhij,bjhk->bihk", weights_BxHxLxL, v_BxLxHxK)


class DenseSynthesizerAttention(base.Attention):
  """Dense Synthesizer (:class:`base.Attention`'s fields, ``qkv_dim`` also the hidden width).

  Attributes:
    dropout_rate: dropout on the ``[B, H, L, L]`` weights.
    max_length: key positions ``W2`` predicts, at least the input length.
    dot_product: add ``Q K^T / sqrt(d)`` (Dense + Vanilla).

  Parameters: ``syn_hidden`` (E -> (H, D/H)), ``syn_out_kernel`` ``[H, D/H, max_length]``
  (Xavier-uniform per head), ``syn_out_bias`` ``[H, max_length]``, ``value``, ``out`` (and
  ``query``, ``key`` with ``dot_product``).
  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``.

  Raises:
    ValueError: input longer than ``max_length``, or bad ``qkv_dim``.
  """

  max_length: int = 2048
  dot_product: bool = False

  @nn.compact
  def __call__(self, x_BxLxE, mask_BxL=None, *, deterministic: bool = True):
    length = x_BxLxE.shape[1]
    base.check_max_length("synthesizer", length, self.max_length)
    mask_BxL = base.default_mask(x_BxLxE, mask_BxL)
    v_BxLxHxK, dots = _values_and_dots(self, x_BxLxE)
    head_dim = v_BxLxHxK.shape[-1]
    hidden_BxLxHxK = nn.relu(nn.DenseGeneral(
        features=(self.num_heads, head_dim), kernel_init=base.KERNEL_INIT,
        bias_init=base.BIAS_INIT, dtype=self.dtype, name="syn_hidden")(x_BxLxE))
    init = nn.initializers.xavier_uniform(in_axis=-2, out_axis=-1, batch_axis=(0,))
    w2_HxKxM = self.param("syn_out_kernel", init, (self.num_heads, head_dim, self.max_length),
                          jnp.float32)
    b2_HxM = self.param("syn_out_bias", base.BIAS_INIT, (self.num_heads, self.max_length),
                        jnp.float32)
    # Only the first L key positions are used: slice the parameters, never [.., M].
    w2_HxKxL = w2_HxKxM[:, :, :length].astype(self.dtype)
    logits_BxHxLxL = (jnp.einsum("bihk,hkj->bhij", hidden_BxLxHxK, w2_HxKxL)
                      + b2_HxM[None, :, None, :length].astype(self.dtype) + dots)
    y_BxLxHxK = synthetic_attention(logits_BxHxLxL, v_BxLxHxK, mask_BxL,
                                    nn.Dropout(self.dropout_rate), deterministic, self.dtype)
    return self.project_out(y_BxLxHxK)


def fixed_random_rows(key: jax.Array, rows: int, shape: tuple[int, ...]) -> jnp.ndarray:
  """float32 ``N(0, 1)`` ``[rows, *shape]``, row i from ``fold_in(key, i)`` whatever ``rows``."""
  return jax.vmap(lambda i: jax.random.normal(jax.random.fold_in(key, i), shape))(
      jnp.arange(rows))


class RandomSynthesizerAttention(base.Attention):
  """Random Synthesizer (:class:`base.Attention`'s fields, then its own).

  Attributes:
    dropout_rate: dropout on the ``[B, H, L, L]`` weights.
    max_length: rows and columns of ``R``, at least the input length.
    trainable: False: ``R`` is a constant from ``random_seed`` (the fixed random synthesizer;
      factors ``N(0, k^-1/2)``, so ``R`` has unit variance).
    factorized_rank: 0 (default) for a full ``R``; k > 0 for ``R = R1 R2``.
    random_seed: seed of the fixed ``R``.
    dot_product: add ``Q K^T / sqrt(d)`` (Random + Vanilla, what LRA ran).
    lra_bugs: LRA's masking: with ``dot_product`` a pad query weighs every key evenly, pads
      included; without it no padding mask. Real outputs are unchanged by the first; pad rows
      matter only to ``model.lra_mean_over_pads``.

  Parameters, when ``trainable``: ``random_logits`` ``[H, M, M]`` (LRA's ``random``) or
  ``random_factor1`` ``[H, M, k]`` and ``random_factor2`` ``[H, k, M]`` (``random1``/``2``),
  each Xavier-uniform as LRA's; ``value``, ``out`` (and ``query``, ``key`` with ``dot_product``).
  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``.

  Raises:
    ValueError: input longer than ``max_length``, ``factorized_rank < 0``, or bad ``qkv_dim``.
  """

  max_length: int = 2048
  trainable: bool = True
  factorized_rank: int = 0
  random_seed: int = 0
  dot_product: bool = False
  lra_bugs: bool = False

  def _logits(self, length: int) -> jnp.ndarray:
    """``R[:, :L, :L]``, ``[H, L, L]`` float32."""
    h, m, k = self.num_heads, self.max_length, self.factorized_rank
    if self.trainable:
      # LRA's xavier_uniform() on the whole array: the fans include H.
      init = nn.initializers.xavier_uniform()
      if k == 0:
        r_HxMxM = self.param("random_logits", init, (h, m, m), jnp.float32)
        return r_HxMxM[:, :length, :length]
      r1_HxMxR = self.param("random_factor1", init, (h, m, k), jnp.float32)
      r2_HxRxM = self.param("random_factor2", init, (h, k, m), jnp.float32)
      return jnp.einsum("hir,hrj->hij", r1_HxMxR[:, :length], r2_HxRxM[:, :, :length])
    key = jax.random.PRNGKey(self.random_seed)
    if k == 0:
      rows_LxHxM = fixed_random_rows(key, length, (h, m))
      return jnp.transpose(rows_LxHxM[:, :, :length], (1, 0, 2))
    key1, key2 = jax.random.split(key)
    rows_LxHxR = fixed_random_rows(key1, length, (h, k)) * k ** -0.25
    cols_LxHxR = fixed_random_rows(key2, length, (h, k)) * k ** -0.25
    return jnp.einsum("ihr,jhr->hij", rows_LxHxR, cols_LxHxR)

  @nn.compact
  def __call__(self, x_BxLxE, mask_BxL=None, *, deterministic: bool = True):
    length = x_BxLxE.shape[1]
    base.check_max_length("synthesizer_random", length, self.max_length)
    if self.factorized_rank < 0:
      raise ValueError(f"model.attention_kwargs.factorized_rank={self.factorized_rank} must "
                       "be >= 0 (0: a full random matrix)")
    mask_BxL = base.default_mask(x_BxLxE, mask_BxL)
    v_BxLxHxK, dots = _values_and_dots(self, x_BxLxE)
    logits_BxHxLxL = self._logits(length)[None].astype(self.dtype) + dots
    lra_pad_queries = self.lra_bugs and self.dot_product
    if self.lra_bugs and not self.dot_product:   # LRA: ignore_dot_product drops the mask
      mask_BxL = jnp.ones_like(mask_BxL)
    y_BxLxHxK = synthetic_attention(logits_BxHxLxL, v_BxLxHxK, mask_BxL,
                                    nn.Dropout(self.dropout_rate), deterministic, self.dtype,
                                    lra_pad_queries)
    return self.project_out(y_BxLxHxK)


_SYNTHESIZER = "Tay et al., Synthesizer (2021)"
registry.register(registry.AttentionSpec(
    "synthesizer", DenseSynthesizerAttention, quadratic=True, paper=_SYNTHESIZER))
registry.register(registry.AttentionSpec(
    "synthesizer_random", RandomSynthesizerAttention, quadratic=True, paper=_SYNTHESIZER))
