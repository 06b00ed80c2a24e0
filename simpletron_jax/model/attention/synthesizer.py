"""Synthesizer attention: attention weights synthesised without token-token dot products.

Tay et al., "Synthesizer: Rethinking Self-Attention in Transformer Models" (ICML 2021);
the LRA "Synthesizer" baseline (``lra_benchmarks/models/synthesizer/
synthesizer_attention.py``). Per head h, with values ``V = X W_v`` (the ``value``
projection) and keys masked at padded positions::

    Y_h = softmax(B_h) V_h

* Dense (``synthesizer``, the paper's Dense Synthesizer): each query row is predicted
  from its own token, ``B_h[i] = W2_h relu(W1 x_i + b1)_h + b2_h``, with ``W1``:
  E -> (H, K) (``syn_hidden``) and ``W2_h``: K -> ``max_length`` (``syn_out_kernel``,
  ``syn_out_bias``), sliced to the first L key positions.
* Random (``synthesizer_random``, the paper's Random Synthesizer): ``B_h = R_h[:L, :L]``
  with a learned ``R`` of shape ``[H, max_length, max_length]`` (``random_logits``; LRA's
  ``random``), initialised as LRA's ``SynthesizerAttention`` does (the paper only says
  "randomly initialised"): ``xavier_uniform()`` over the whole ``[H, M, M]`` array, whose
  fans are ``H * M`` each (the head axis counts as a receptive field), so
  ``U(+-sqrt(3 / (H M)))``: ``R`` starts close to 0, the attention close to uniform.
  ``factorized_rank = k > 0`` learns ``R_h = R1_h R2_h`` with ``R1_h``
  ``[max_length, k]`` and ``R2_h`` ``[k, max_length]`` (``random_factor1``/``2``, LRA's
  ``random1``/``2``: the paper's factorized random synthesizer, LRA's
  ``synthesizer_mode='factorized_random'``, ``k=32``, which its configs never reach), each
  ``xavier_uniform()`` as in LRA (fans ``H M`` and ``H k``). ``trainable=False`` is
  the paper's fixed random synthesizer: ``R`` is not a parameter but drawn ``N(0, 1)`` from
  ``jax.random.PRNGKey(random_seed)`` in every call (row i from ``fold_in(key, i)``,
  so rows do not depend on L: padding invariance), at a cost of O(L H max_length)
  random numbers per call (the factors: ``N(0, k^-1/2)`` each, so ``R`` has unit variance).

There is no ``1/sqrt(d)`` scaling and no query or key projection, unless
``dot_product=True``: then the softmax-attention logits ``Q K^T / sqrt(d)`` (from the
``query``/``key`` projections) are added to ``B`` before the softmax, the paper's
"Random + Vanilla" / "Dense + Vanilla" mixtures. Both forms build
``[B, H, L, L]`` weights: quadratic in time and memory.

Padding: the logits of pad keys are replaced by a large negative number, so pad
keys get zero weight; the logits of real keys depend only on the query token and
on the key POSITION, so appending pads changes nothing at real positions.
``lra_bugs=True`` (random form only) reproduces LRA's masking instead
(``synthesizer_attention.py``): with the dot product, the mask is the outer product of the
query and key masks added as a ``-1e10`` bias, so a PAD QUERY's row is ``-1e10``
everywhere and (in float32, where ``-1e10 + x == -1e10``) averages every value, pads
included; this matters where LRA averages over the pads (MEAN pooling). Without the dot
product (``ignore_dot_product=True``) LRA applies no padding mask at all.

LRA defaults: its ``SynthesizerAttention`` takes ``max_length`` (512 by default, the
model's ``max_len`` + 1 in practice). Its blocks (``models/synthesizer/synthesizer.py``)
default to ``synthesizer_mode='random'`` with ``ignore_dot_product=False``, i.e. random
logits PLUS the dot product, and that is what LRA ran: the image configs set
``config.model.synthesizer_mode='random'``, and the text config's
``synthesizer_mode='factorized_random'``, ``k=32``, ``ignore_dot_product=True`` are
top-level config fields that ``text_classification/train.py`` never passes to the
model (only ``config.model`` is). To reproduce LRA use ``synthesizer_random`` with
``dot_product=True``, as ``configs/<task>/synthesizer_random.py`` do; the module's default
is the pure form of the paper. LRA's dense form
shares ``W2`` across heads and reshapes ``[B, L, H, M]`` to ``[B, H, L, M]`` without a
transpose (mixing heads and positions); here ``W2`` is per head and the axes are kept.

Causal form: none; the variants are used bidirectionally, as in LRA.

Config note: set ``model.attention_kwargs.max_length = model.max_length + 1`` (the
CLS token); the default is 2048.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from simpletron_jax.model.attention import base, registry

NEG = -1e30


def _values_and_dots(module: base.Attention, x_BxLxE):
  """``(v_BxLxHxK, dots)``: the values, and ``Q K^T / sqrt(d)`` (``[B, H, L, L]``) when
  ``module.dot_product`` else 0, projected with ``module``'s fields (:class:`base.Attention`;
  call it inside its compact ``__call__``)."""
  if not module.dot_product:
    return module.project_heads(x_BxLxE, "value"), 0.0
  q, k, v = module.project_qkv(x_BxLxE)
  q = q / jnp.sqrt(q.shape[-1]).astype(module.dtype)
  return v, jnp.einsum("bihk,bjhk->bhij", q, k)


def synthetic_attention(logits_BxHxLxL, v_BxLxHxK, mask_BxL, dropout: nn.Module,
                        deterministic: bool, dtype, lra_pad_queries: bool = False
                        ) -> jnp.ndarray:
  """``softmax(B) V`` with pad keys masked; the softmax is float32.

  Args:
    logits_BxHxLxL: synthesised logits ``B`` (rows: queries, columns: keys); a
      ``[1, H, L, L]`` batch axis broadcasts.
    v_BxLxHxK: values.
    mask_BxL: bool, True for real tokens.
    dropout: an ``nn.Dropout`` applied to the weights.
    deterministic: disables dropout.
    dtype: dtype of the weights after the softmax.
    lra_pad_queries: give each pad query uniform weights over every key, pads included,
      as LRA's ``-1e10`` query-and-key mask does (``synthesizer_attention.py``).

  Returns:
    ``[B, L, H, K]``.
  """
  logits = jnp.where(mask_BxL[:, None, None, :], logits_BxHxLxL.astype(jnp.float32), NEG)
  if lra_pad_queries:   # LRA: a pad query's row is all -1e10, i.e. uniform over every key
    logits = jnp.where(mask_BxL[:, None, :, None], logits, 0.0)
  weights_BxHxLxL = jax.nn.softmax(logits, axis=-1).astype(dtype)
  weights_BxHxLxL = dropout(weights_BxHxLxL, deterministic=deterministic)
  return jnp.einsum("bhij,bjhk->bihk", weights_BxHxLxL, v_BxLxHxK)


class DenseSynthesizerAttention(base.Attention):
  """Dense Synthesizer (Tay et al., 2021); non-causal, quadratic.

  Fields: :class:`base.Attention`'s ``num_heads`` (H), ``qkv_dim`` (D, the values' and the
  hidden layer's width over all heads), ``out_dim`` (O), ``use_bias`` and ``dense_init`` (of
  the ``value`` and ``out`` projections, and ``query`` and ``key`` with ``dot_product``), then
  ``dropout_rate``, ``dtype`` and its own options:

  Attributes:
    dropout_rate: dropout on the ``[B, H, L, L]`` attention weights.
    max_length: the number of key positions ``W2`` predicts; must be at least the
      input length. Configs must set ``model.attention_kwargs.max_length =
      model.max_length + 1``.
    dot_product: if True, add ``Q K^T / sqrt(d)`` to the logits (Dense + Vanilla).
    dtype: computation dtype; the softmax is float32.

  Parameters: ``syn_hidden`` (``DenseGeneral`` E -> (H, D/H)), ``syn_out_kernel``
  ``[H, D/H, max_length]`` (Xavier-uniform per head), ``syn_out_bias``
  ``[H, max_length]`` (normal(1e-6)), ``value``, ``out`` (and ``query``, ``key`` with
  ``dot_product``).

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``.

  Raises:
    ValueError: if the input is longer than ``max_length`` (naming
      ``model.attention_kwargs.max_length``) or ``qkv_dim`` is not a multiple of
      ``num_heads``.
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
  """``N(0, 1)`` rows ``i = 0..rows-1`` of shape ``shape``, row i from ``fold_in(key, i)``.

  Row i does not depend on ``rows``, so a longer input sees the same first rows.

  Returns:
    float32 ``[rows, *shape]``.
  """
  return jax.vmap(lambda i: jax.random.normal(jax.random.fold_in(key, i), shape))(
      jnp.arange(rows))


class RandomSynthesizerAttention(base.Attention):
  """Random Synthesizer (Tay et al., 2021); non-causal, quadratic.

  Fields: :class:`base.Attention`'s ``num_heads`` (H), ``qkv_dim`` (D, the values' width
  over all heads), ``out_dim`` (O), ``use_bias`` and ``dense_init`` (of the ``value`` and
  ``out`` projections, and ``query`` and ``key`` with ``dot_product``), then ``dropout_rate``,
  ``dtype`` and its own options:

  Attributes:
    dropout_rate: dropout on the ``[B, H, L, L]`` attention weights.
    max_length: rows and columns of ``R``; must be at least the input length.
      Configs must set ``model.attention_kwargs.max_length = model.max_length + 1``.
    trainable: if True (default) ``R`` is a parameter; if False it is a constant
      drawn from ``random_seed`` (the paper's fixed random synthesizer).
    factorized_rank: 0 (default) for a full ``R``; k > 0 for ``R = R1 R2`` of rank k.
    random_seed: seed of the fixed ``R`` (``trainable=False`` only).
    dot_product: if True, add ``Q K^T / sqrt(d)`` to the logits (Random + Vanilla,
      what LRA's Synthesizer runs).
    lra_bugs: reproduce the padding bugs of LRA's ``SynthesizerAttention``
      (``models/synthesizer/synthesizer_attention.py``; default False, the correct
      function): with ``dot_product``, every pad query attends uniformly to every key,
      pads included (LRA's ``-1e10`` bias on the query-and-key mask); without it, no
      padding mask at all (LRA drops the mask when ``ignore_dot_product=True``). Real
      queries' outputs are unchanged by the first; pad positions' outputs reach the
      result only through LRA's MEAN over the pads (``model.lra_mean_over_pads``).
    dtype: computation dtype; the softmax is float32.

  Parameters: ``random_logits`` ``[H, max_length, max_length]`` (LRA's ``random``; or
  ``random_factor1`` ``[H, max_length, k]`` and ``random_factor2`` ``[H, k, max_length]``,
  LRA's ``random1``, ``random2``), each ``xavier_uniform()`` as in LRA, when
  ``trainable``; ``value`` and ``out`` (and ``query``, ``key`` with ``dot_product``).

  Call: ``(x_BxLxE float, mask_BxL bool | None, deterministic) -> y_BxLxO``.

  Raises:
    ValueError: if the input is longer than ``max_length`` (naming
      ``model.attention_kwargs.max_length``), ``factorized_rank < 0`` (naming
      ``model.attention_kwargs.factorized_rank``) or ``qkv_dim`` is not a multiple of
      ``num_heads``.
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
      # LRA's kernel_init, xavier_uniform() on the whole array: fans over H * (last axes).
      init = nn.initializers.xavier_uniform()
      if k == 0:
        r_HxMxM = self.param("random_logits", init, (h, m, m), jnp.float32)
        return r_HxMxM[:, :length, :length]
      r1_HxMxR = self.param("random_factor1", init, (h, m, k), jnp.float32)
      r2_HxRxM = self.param("random_factor2", init, (h, k, m), jnp.float32)
      return jnp.einsum("hir,hrj->hij", r1_HxMxR[:, :length], r2_HxRxM[:, :, :length])
    # Fixed: generate only the rows (and, for the factors, columns) used.
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
