"""Issue 10's exact speed paths: softmax implementations (einsum, XLA, cuDNN flash) with
their fallbacks, and the last encoder block on the CLS position only."""

from __future__ import annotations

import functools
import logging
import threading

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simpletron_jax.model import attention, encoders
from simpletron_jax.model.attention import softmax
from tests.module_support import init_variables

ON_GPU = jax.default_backend() == "gpu"


def _x_and_mask(batch=2, length=9, emb=16, lengths=(9, 5), dtype=jnp.float32):
  x_BxLxE = jax.random.normal(jax.random.PRNGKey(0), (batch, length, emb)).astype(dtype)
  mask_BxL = jnp.arange(length)[None, :] < jnp.asarray(lengths)[:, None]
  return x_BxLxE, mask_BxL


def _softmax(dtype=jnp.float32, heads=2, dim=16, **kwargs):
  return attention.get("softmax").build(num_heads=heads, qkv_dim=dim, out_dim=dim,
                                        dropout_rate=kwargs.pop("dropout_rate", 0.0),
                                        dtype=dtype, **kwargs)


def _softmax_params(x_BxLxE, mask_BxL):
  """``_softmax()``'s parameters, which no option (implementation, causal, dropout) changes
  (tests/module_support.py: no program of the whole init)."""
  return init_variables(_softmax(), x_BxLxE, mask_BxL)


@pytest.fixture
def fresh_log(monkeypatch):
  """An empty once-per-reason log, so each test sees its own warnings."""
  monkeypatch.setattr(softmax, "_LOGGED_REASONS", set())


@pytest.mark.parametrize("kwargs, expected, why", [
    (dict(requested="einsum", backend="gpu", dtype=jnp.bfloat16, head_dim=64,
          dropout_active=True), "einsum", ""),
    (dict(requested="flash", backend="gpu", dtype=jnp.bfloat16, head_dim=64,
          dropout_active=False), "flash", ""),
    (dict(requested="flash", backend="cpu", dtype=jnp.bfloat16, head_dim=64,
          dropout_active=False), "xla", "needs a GPU"),
    (dict(requested="flash", backend="gpu", dtype=jnp.float32, head_dim=64,
          dropout_active=False), "xla", "bfloat16 or float16"),
    (dict(requested="cudnn", backend="gpu", dtype=jnp.bfloat16, head_dim=12,
          dropout_active=False), "xla", "multiple of 8"),
    (dict(requested="flash", backend="gpu", dtype=jnp.bfloat16, head_dim=64,
          dropout_active=True), "einsum", "no attention dropout"),
    (dict(requested="fused", backend="cpu", dtype=jnp.float32, head_dim=8,
          dropout_active=True), "einsum", "no attention dropout"),
    (dict(requested="fused", backend="cpu", dtype=jnp.float32, head_dim=8,
          dropout_active=False), "xla", ""),
])
def test_resolve_implementation_falls_back_with_the_reason(kwargs, expected, why):
  impl, reason = softmax.resolve_implementation(kwargs.pop("requested"), **kwargs)
  assert impl == expected
  assert (why in reason) if why else reason == ""


def test_unknown_implementation_names_the_config_field():
  with pytest.raises(ValueError, match="model.attention_kwargs.implementation"):
    softmax.resolve_implementation("flashy", backend="gpu", dtype=jnp.bfloat16, head_dim=64,
                                   dropout_active=False)


def test_recording_fallbacks_keeps_each_threads_reasons_even_once_logged(fresh_log):
  # speed_memory.py traces cells in threads and reports each cell's own fallbacks.
  barrier, seen = threading.Barrier(2), {}

  def trace(name: str) -> None:
    with softmax.recording_fallbacks() as reasons:
      softmax.log_fallback_once(f"reason {name}")
      barrier.wait()                       # both threads are inside their blocks now
      softmax.log_fallback_once("shared reason")
      barrier.wait()
      seen[name] = list(reasons)

  threads = [threading.Thread(target=trace, args=(n,)) for n in "ab"]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert seen == {"a": ["reason a", "shared reason"], "b": ["reason b", "shared reason"]}
  assert softmax._LOGGED_REASONS == {"reason a", "reason b", "shared reason"}
  softmax.log_fallback_once("after")       # outside any block: nothing is recorded
  assert seen["a"] == ["reason a", "shared reason"]


@pytest.mark.skipif(ON_GPU, reason="checks the CPU fallback")
def test_flash_on_cpu_logs_once_and_computes_softmax(fresh_log, caplog):
  x, mask = _x_and_mask()
  reference = _softmax()
  params = _softmax_params(x, mask)
  with caplog.at_level(logging.WARNING, logger=softmax.__name__):
    y_flash = jax.jit(_softmax(implementation="flash").apply)(params, x, mask)
    jax.jit(_softmax(implementation="flash").apply)(params, x, mask)
  messages = [r.getMessage() for r in caplog.records]
  assert len(messages) == 1 and "needs a GPU" in messages[0]
  real = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(y_flash)[real],
                             np.asarray(jax.jit(reference.apply)(params, x, mask))[real],
                             rtol=1e-5, atol=1e-5)


def test_fused_with_active_dropout_uses_einsum_and_says_why(fresh_log, caplog):
  x, mask = _x_and_mask()
  module = _softmax(implementation="xla", dropout_rate=0.5)
  params = _softmax_params(x, mask)
  rngs = {"dropout": jax.random.PRNGKey(2)}

  def train_mode(m):
    # jitted: one program, not one per operation; the fallback is chosen (and logged) while
    # tracing, inside the caplog block
    return jax.jit(lambda p: m.apply(p, x, mask, deterministic=False, rngs=rngs))(params)
  with caplog.at_level(logging.WARNING, logger=softmax.__name__):
    y = train_mode(module)
  y_einsum = train_mode(_softmax(implementation="einsum", dropout_rate=0.5))
  assert any("no attention dropout" in r.getMessage() for r in caplog.records)
  np.testing.assert_allclose(np.asarray(y), np.asarray(y_einsum), rtol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_xla_equals_einsum_with_padding(causal):
  x, mask = _x_and_mask()
  params = _softmax_params(x, mask)
  real = np.asarray(mask)
  # both implementations in one program, not one per operation
  y = jax.jit(lambda p: {impl: _softmax(implementation=impl, causal=causal).apply(p, x, mask)
                         for impl in ("einsum", "xla")})(params)
  y = {impl: np.asarray(out) for impl, out in y.items()}
  np.testing.assert_allclose(y["xla"][real], y["einsum"][real], rtol=1e-5, atol=1e-5)


def test_right_padding_check():
  mask = jnp.array([[1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]], bool)
  np.testing.assert_array_equal(np.asarray(softmax.is_right_padded(mask)),
                                [True, False, True, True])
  np.testing.assert_array_equal(np.asarray(softmax.key_lengths(mask)), [2, 2, 1, 4])


@pytest.mark.parametrize("causal", [False, True])
def test_flash_padding_to_the_tile_keeps_the_function(causal):
  # The flash path pads L to a multiple of FLASH_LENGTH_MULTIPLE and masks keys by length. Run
  # through XLA (the same call, implementation="xla") it must equal einsum at an odd length,
  # outputs and all three input gradients, on real positions.
  b, length, h, k = 3, 67, 2, 8
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  q, kk, v = (jax.random.normal(key, (b, length, h, k)) for key in keys)
  mask = jnp.arange(length)[None, :] < jnp.asarray([67, 40, 1])[:, None]
  keep = mask[:, None, None, :]
  if causal:
    keep = keep & jnp.tril(jnp.ones((length, length), bool))[None, None]
  weight = mask[:, :, None, None].astype(jnp.float32)

  def loss(fn):
    return lambda q, kk, v: jnp.sum(jnp.sin(fn(q, kk, v)) * weight)
  flash = lambda q, kk, v: softmax.flash_attention(q, kk, v, mask, causal,  # noqa: E731
                                                   implementation="xla")
  einsum = lambda q, kk, v: softmax.einsum_attention(q, kk, v, keep)  # noqa: E731

  @jax.jit   # both outputs and all gradients in one program, not one per operation
  def outputs_and_grads(q, kk, v):
    return ([fn(q, kk, v) for fn in (flash, einsum)],
            [jax.grad(loss(fn), argnums=(0, 1, 2))(q, kk, v) for fn in (flash, einsum)])
  (y_flash, y_einsum), grads = outputs_and_grads(q, kk, v)
  real = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(y_flash)[real], np.asarray(y_einsum)[real], rtol=1e-5,
                             atol=1e-5)
  chex.assert_trees_all_close(grads[0], grads[1], rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not ON_GPU, reason="cuDNN flash attention needs an NVIDIA GPU")
def test_flash_equals_einsum_on_gpu_bfloat16_with_padding(fresh_log, caplog):
  # B 4, L 513 (odd, like max_length + CLS; the first token always real), 4 heads of 64,
  # right-padded rows.
  x, mask = _x_and_mask(batch=4, length=513, emb=256, lengths=(513, 300, 17, 1),
                        dtype=jnp.bfloat16)
  einsum = _softmax(jnp.bfloat16, heads=4, dim=256)
  flash = _softmax(jnp.bfloat16, heads=4, dim=256, implementation="flash")
  params = init_variables(einsum, x, mask)
  with caplog.at_level(logging.WARNING, logger=softmax.__name__):
    y_flash = flash.apply(params, x, mask)
  assert not caplog.records, [r.getMessage() for r in caplog.records]
  real = np.asarray(mask)
  y_einsum = einsum.apply(params, x, mask)
  np.testing.assert_allclose(np.asarray(y_flash, np.float32)[real],
                             np.asarray(y_einsum, np.float32)[real], rtol=2e-2, atol=2e-2)

  def loss(module, p):
    y = module.apply(p, x, mask).astype(jnp.float32)
    return jnp.sum(jnp.where(mask[..., None], y, 0.0) ** 2)
  g_flash, g_einsum = (jax.grad(lambda p, m=m: loss(m, p))(params) for m in (flash, einsum))
  # The key bias adds q . b to every logit of a row, which softmax ignores: its gradient is
  # zero up to rounding in both, so only its size is checked.
  g_flash, g_einsum = (dict(g["params"]) for g in (g_flash, g_einsum))
  key_bias = [np.abs(np.asarray(g["key"]["bias"], np.float32)).max() for g in (g_flash, g_einsum)]
  key_kernel = np.abs(np.asarray(g_einsum["key"]["kernel"], np.float32)).max()
  assert max(key_bias) < 3e-2 * key_kernel, (key_bias, key_kernel)
  for name in ("query", "key", "value", "out"):
    for leaf in ("kernel", "bias"):
      if (name, leaf) == ("key", "bias"):
        continue
      a, b = (np.asarray(g[name][leaf], np.float32) for g in (g_flash, g_einsum))
      scale = np.abs(b).max() + 1e-6
      np.testing.assert_allclose(a / scale, b / scale, atol=3e-2, err_msg=f"{name}/{leaf}")


# ----------------------------------------------------------------------------
# The last block on the CLS position only.


def _classifier(attention_name, cls_only, pool="CLS", num_layers=1, length_multiple=1,
                **attention_kwargs):
  encoder = encoders.Encoder(config=encoders.ModelConfig(
      emb_dim=16, num_heads=2, qkv_dim=16, mlp_dim=32, num_layers=num_layers, max_length=12,
      attention=attention_name, attention_kwargs=attention_kwargs, classifier_pool=pool,
      last_block_cls_only=cls_only, length_multiple=length_multiple), vocab_size=20)
  return encoders.ClassificationEncoder(encoder=encoder, num_classes=3)


def _tokens():
  rng = np.random.default_rng(0)
  real = np.arange(12)[None, :] < np.array([[12], [6], [3]])
  return jnp.asarray(rng.integers(1, 20, (3, 12)) * real, jnp.int32)


def _classifier_params(model, tokens):
  """``model``'s parameters: only the init's random draws run (tests/module_support.py), one
  small program per shape, shared by every classifier of the suite; a classifier's jitted
  init compiles to a large program (a random draw per parameter)."""
  return init_variables(model, tokens, seed=0)


@functools.partial(jax.jit, static_argnums=0)
def _logits_and_grads(model, params, tokens):
  """One program per model (modules compare by their fields): two tests share a reference."""
  loss = lambda p: jnp.sum(jnp.sin(model.apply(p, tokens)))  # noqa: E731
  return model.apply(params, tokens), jax.grad(loss)(params)


def _assert_same_logits_and_grads(model, reference, tokens):
  """``model`` and ``reference`` (same parameters) agree in logits and every gradient."""
  params = _classifier_params(reference, tokens)
  logits, grads = _logits_and_grads(model, params, tokens)
  logits_ref, grads_ref = _logits_and_grads(reference, params, tokens)
  chex.assert_trees_all_close(logits, logits_ref, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(grads, grads_ref, rtol=1e-4, atol=1e-6)


def _block_output_shapes(model, tokens) -> list[tuple[int, ...]]:
  """The output shape of each encoder block, from shapes alone."""
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0), tokens)
  blocks = jax.eval_shape(lambda p: model.apply(p, tokens, capture_intermediates=True,
                                                mutable="intermediates")[1],
                          params)["intermediates"]["encoder"]
  return [out["__call__"][0].shape for name, out in sorted(blocks.items())
          if name.startswith("encoderblock_")]


@pytest.mark.parametrize("name, kwargs", [("softmax", {"causal": True}), ("simple", {})])
def test_last_block_cls_only_gives_the_same_logits_and_gradients(name, kwargs):
  _assert_same_logits_and_grads(_classifier(name, True, **kwargs),
                                _classifier(name, False, **kwargs), _tokens())


def test_block_diagonal_with_the_gpu_options_gives_the_same_logits_and_gradients():
  # Simple's GPU flags (block_diagonal, the last block on CLS, the length padded to a
  # multiple of 8) against the plain model, on a batch with padded rows.
  fast = _classifier("simple", True, num_layers=2, length_multiple=8, block_diagonal=True)
  _assert_same_logits_and_grads(fast, _classifier("simple", False, num_layers=2), _tokens())


def test_last_block_cls_only_skips_work_and_mean_pooling_ignores_it():
  tokens = _tokens()
  assert _block_output_shapes(_classifier("softmax", True, num_layers=2), tokens) == [
      (3, 13, 16), (3, 1, 16)]
  assert _block_output_shapes(_classifier("simple", True, "MEAN", num_layers=2), tokens) == [
      (3, 12, 16), (3, 12, 16)]


def test_num_queries_is_not_a_user_option():
  from configs import lra  # noqa: PLC0415
  model = lra.make_config("listops", "softmax", "tiny").model
  model.attention_kwargs.num_queries = 1
  with pytest.raises(ValueError, match="model.last_block_cls_only"):
    encoders.ModelConfig.from_config_dict(model)


# ----------------------------------------------------------------------------
# The length padded to a multiple with masked positions (model.length_multiple).


def test_length_multiple_keeps_the_logits_of_every_attention_it_allows():
  tokens = _tokens()   # 12 tokens + CLS = 13 positions, padded to 16
  names = [n for n in attention.names() if attention.get(n).length_padding_exact]
  params = {name: _classifier_params(_classifier(name, False), tokens) for name in names}

  @jax.jit   # every attention's two applies in one program, not one per operation
  def padded_and_reference(params):
    return {name: (_classifier(name, False, length_multiple=8).apply(params[name], tokens),
                   _classifier(name, False).apply(params[name], tokens)) for name in names}
  for name, (logits, logits_ref) in padded_and_reference(params).items():
    chex.assert_trees_all_close(logits, logits_ref, rtol=1e-5, atol=1e-6, custom_message=name)


def test_length_multiple_keeps_the_gradients_and_pads_the_blocks():
  padded = _classifier("simple", True, num_layers=2, length_multiple=8)   # with CLS-only too
  _assert_same_logits_and_grads(padded, _classifier("simple", False, num_layers=2), _tokens())
  assert _block_output_shapes(padded, _tokens()) == [(3, 16, 16), (3, 1, 16)]


@pytest.mark.parametrize("attention_name, kwargs, multiple, message", [
    ("linformer", {}, 8, "would change what attention 'linformer' computes"),
    ("simple", {"normalizer": "padded"}, 8, "lets the padding into Simple attention"),
    ("simple", {"mask_pads": False}, 8, "lets the padding into Simple attention"),
    ("simple", {}, 0, "must be a positive int"),
])
def test_length_multiple_is_refused_where_it_would_change_the_function(attention_name, kwargs,
                                                                      multiple, message):
  from configs import lra  # noqa: PLC0415
  model = lra.make_config("listops", attention_name, "tiny").model
  model.attention_kwargs.update(kwargs)
  model.length_multiple = multiple
  with pytest.raises(ValueError, match=message):
    encoders.ModelConfig.from_config_dict(model)
  model.length_multiple = 1
  encoders.ModelConfig.from_config_dict(model)
