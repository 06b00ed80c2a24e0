"""``SoftmaxAttention(implementation="flash")`` on a TPU: the Pallas TPU flash-attention kernel.

Run on this CPU host two ways: in Pallas's TPU interpret mode (the kernel's own program,
simulated on the CPU) with :func:`base.compiling_for` ``("tpu")``, where it must compute
``einsum``'s function at every position, gradients included; and compiled by libtpu for a
TPU topology, where the compiled step must hold the kernel's Mosaic custom call. libtpu is in
the ``test`` extra; tests/conftest.py lets several processes load it.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import topologies
from jax.experimental.pallas import tpu as pltpu

from simpletron_jax.model import attention
from simpletron_jax.model.attention import base, softmax
from tests.module_support import init_variables

TPU_KERNEL = softmax.FLASH_KERNELS["tpu"]


def _softmax(dtype=jnp.float32, heads=2, dim=16, **kwargs):
  return attention.get("softmax").build(num_heads=heads, qkv_dim=dim, out_dim=dim,
                                        dropout_rate=kwargs.pop("dropout_rate", 0.0),
                                        dtype=dtype, **kwargs)


def _x_and_mask(lengths, length=33, emb=16, dtype=jnp.float32):
  x_BxLxE = jax.random.normal(jax.random.PRNGKey(0), (len(lengths), length, emb)).astype(dtype)
  mask_BxL = jnp.arange(length)[None, :] < jnp.asarray(lengths)[:, None]
  return x_BxLxE, mask_BxL


def _pull_back(fn, *args):
  """``y = fn(*args)`` and the pull-back of the cotangent ``cos(y)`` to every argument."""
  y, vjp = jax.vjp(fn, *args)
  return y, vjp(jnp.cos(y))


def _both_outputs_and_grads(kernel, reference, *args):
  """:func:`_pull_back` of ``kernel`` (traced for a TPU, in Pallas's interpret mode) and of
  ``reference`` (traced for this host) in one jitted program (the interpret mode's simulation
  runs faster compiled than eagerly; one program, not two), and the jaxpr text of that trace
  (read from it, not from a second trace). Returns ``(kernel's, reference's, jaxpr)``."""
  def run(*args):
    with base.compiling_for("tpu"):
      ours = _pull_back(kernel, *args)
    return ours, _pull_back(reference, *args)
  with pltpu.force_tpu_interpret_mode():
    traced = jax.jit(run).trace(*args)
    ours, ref = traced.lower().compile()(*args)
  return ours, ref, str(traced.jaxpr)


def test_compiling_for_sets_the_target_platform_in_its_block_only():
  default = jax.default_backend()
  assert base.target_platform() == default
  with base.compiling_for("tpu"):
    assert base.target_platform() == "tpu"
    with base.compiling_for("gpu"):
      assert base.target_platform() == "gpu"
    assert base.target_platform() == "tpu"
  assert base.target_platform() == default
  with pytest.raises(ValueError, match="compiling_for\\('cuda'\\)"):
    with base.compiling_for("cuda"):
      pass
  assert base.target_platform() == default


@pytest.mark.parametrize("causal, lengths", [
    # The last row has no real token: an even spread, as einsum. About 10-15 s on 2 cores.
    pytest.param(False, (33, 20, 0), marks=pytest.mark.slow),
    (True, (33, 20, 1)),    # causal needs a real first token (CLS) for einsum's function
])
def test_flash_equals_einsum_in_tpu_interpret_mode(causal, lengths):
  # L = 33 (odd, like max_length + CLS) pads to one 128 block; outputs at every position,
  # pads included, and the gradients of the parameters and the input.
  x, mask = _x_and_mask(lengths)
  params = init_variables(_softmax(), x, mask, seed=1)

  def apply(impl):
    module = _softmax(implementation=impl, causal=causal)
    return lambda p, x_: module.apply(p, x_, mask)
  with softmax.recording_fallbacks() as reasons:
    (y_flash, (g_params, g_x)), (y_einsum, (e_params, e_x)), jaxpr = _both_outputs_and_grads(
        apply("flash"), apply("einsum"), params, x)
  assert "pallas_call" in jaxpr
  assert reasons == []
  np.testing.assert_allclose(np.asarray(y_flash), np.asarray(y_einsum), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(g_x), np.asarray(e_x), rtol=1e-5, atol=1e-5)
  chex.assert_trees_all_close(g_params, e_params, rtol=1e-5, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_tpu_kernel_over_several_blocks_equals_einsum(causal):
  # L = 300 pads to 384: three 128 blocks of queries and keys, the kernel's online softmax
  # across key blocks (the real keys fill blocks 0 and 1) and a fully masked key block (2).
  b, length, h, k = 1, 300, 1, 8
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  q, kk, v = (jax.random.normal(key, (b, length, h, k)) for key in keys)
  mask = jnp.arange(length)[None, :] < jnp.asarray([250])[:, None]
  keep = mask[:, None, None, :]
  if causal:
    keep = keep & jnp.tril(jnp.ones((length, length), bool))[None, None]
  (y, grads), (y_ref, grads_ref), jaxpr = _both_outputs_and_grads(
      lambda *qkv: softmax.tpu_flash_attention(*qkv, mask, causal),
      lambda *qkv: softmax.einsum_attention(*qkv, keep), q, kk, v)
  assert "pallas_call" in jaxpr
  np.testing.assert_allclose(np.asarray(y), np.asarray(y_ref), rtol=1e-5, atol=1e-5)
  chex.assert_trees_all_close(grads, grads_ref, rtol=1e-5, atol=1e-5)


def test_flash_attention_picks_the_kernel_of_the_target_platform():
  q = jnp.ones((1, 9, 2, 8))
  mask = jnp.ones((1, 9), bool)
  trace = lambda: str(jax.make_jaxpr(  # noqa: E731
      lambda q: softmax.flash_attention(q, q, q, mask, False))(q))
  with base.compiling_for("tpu"):
    assert "pallas_call" in trace()
  with base.compiling_for("gpu"):
    try:
      assert "pallas_call" not in trace()
    except RuntimeError as error:   # cuDNN's own check on a host without it
      assert "cuDNN" in str(error)


@pytest.mark.parametrize("dtype, head_dim, why", [
    (jnp.float16, 64, "needs float32 or bfloat16 (model.dtype is float16)"),
    (jnp.bfloat16, 192, "needs a head dim of at most 128 or a multiple of 128 (got 192)"),
])
def test_tpu_limits_fall_back_to_xla_naming_the_kernel(dtype, head_dim, why):
  impl, reason = softmax.resolve_implementation("flash", backend="tpu", dtype=dtype,
                                                head_dim=head_dim, dropout_active=False)
  assert impl == "xla" and reason == f"{TPU_KERNEL} {why}; using 'xla'"
  for ok in ((jnp.float32, 8), (jnp.bfloat16, 128), (jnp.bfloat16, 256)):
    assert softmax.resolve_implementation("flash", backend="tpu", dtype=ok[0], head_dim=ok[1],
                                          dropout_active=False) == ("flash", "")
  _, cpu_reason = softmax.resolve_implementation("flash", backend="cpu", dtype=dtype,
                                                 head_dim=head_dim, dropout_active=False)
  assert "needs a GPU (cuDNN) or a TPU" in cpu_reason


def test_tpu_fallbacks_in_the_module_say_why_and_keep_the_function():
  x, mask = _x_and_mask((33, 20))
  params = init_variables(_softmax(), x, mask, seed=1)
  rngs = {"dropout": jax.random.PRNGKey(2)}
  reasons = []

  def apply(deterministic=True, **kwargs):
    return _softmax(**kwargs).apply(params, x, mask, deterministic=deterministic, rngs=rngs)

  # The three fallbacks (traced for a TPU) and the implementations they fall back to (traced
  # for this host) in one jitted program, not one program per operation.
  @jax.jit
  def outputs():
    with base.compiling_for("tpu"), softmax.recording_fallbacks() as recorded:
      fallbacks = (apply(False, implementation="flash", dropout_rate=0.5),
                   apply(implementation="flash", lra_masking=True),
                   _softmax(implementation="flash", num_queries=1).apply(params, x, mask))
    reasons.extend(recorded)
    return fallbacks, (apply(False, dropout_rate=0.5),   # einsum's
                       apply(implementation="xla", lra_masking=True),
                       _softmax(implementation="xla", num_queries=1).apply(params, x, mask))
  (y_dropout, y_lra, y_cls), (y_einsum, y_xla_lra, y_xla) = outputs()
  assert reasons == [
      f"softmax implementation 'flash' ({TPU_KERNEL}) has no attention dropout; using "
      "'einsum' (set model.attention_dropout_rate=0 to use it)",
      f"{TPU_KERNEL} masks keys only; lra_masking=True uses 'xla'",
      f"{TPU_KERNEL} runs full self-attention only here; the block with num_queries=1 uses "
      "'xla'"]
  assert not any("cuDNN" in r for r in reasons)
  np.testing.assert_array_equal(np.asarray(y_dropout), np.asarray(y_einsum))
  np.testing.assert_array_equal(np.asarray(y_lra), np.asarray(y_xla_lra))
  np.testing.assert_array_equal(np.asarray(y_cls), np.asarray(y_xla))


def _tpu_device():
  return topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices[0]


def _compiled_grad_text(implementation: str, device) -> str:
  """HLO text of the module's forward and gradient compiled for ``device``, bfloat16,
  L = 129 (odd: padded to 256), 2 heads of 64."""
  batch, length, emb = 2, 129, 128
  module = _softmax(jnp.bfloat16, heads=2, dim=emb, implementation=implementation)
  sharding = jax.sharding.SingleDeviceSharding(device)
  x = jax.ShapeDtypeStruct((batch, length, emb), jnp.bfloat16, sharding=sharding)
  mask = jax.ShapeDtypeStruct((batch, length), jnp.bool_, sharding=sharding)
  shapes = jax.eval_shape(_softmax(jnp.bfloat16, heads=2, dim=emb).init,
                          jax.random.PRNGKey(0), x, mask)
  params = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
                        shapes)

  def step(p, x_, m):
    loss = lambda p_, x__: jnp.sum(module.apply(p_, x__, m).astype(jnp.float32) ** 2)  # noqa: E731
    return jax.grad(loss, argnums=(0, 1))(p, x_)
  with base.compiling_for("tpu"), softmax.recording_fallbacks() as reasons:
    lowered = jax.jit(step).lower(params, x, mask)
  assert reasons == []
  return lowered.compile().as_text()


def test_flash_forward_and_grad_compile_for_a_tpu_with_the_pallas_kernel():
  device = _tpu_device()
  assert device.platform == "tpu"
  flash = _compiled_grad_text("flash", device)
  # The forward kernel (with residuals) and the backward dK/dV and dQ kernels.
  assert flash.count('custom_call_target="tpu_custom_call"') >= 3
  assert "tpu_custom_call" not in _compiled_grad_text("einsum", device)
