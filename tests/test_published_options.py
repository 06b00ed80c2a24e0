"""Options that reproduce the published runs (docs/fidelity.md), each against a
numpy reference: the SimpleTRON authors' SimpleAttention, LRA's missing padding masks, the
authors' encoder and heads, the retrieval interaction and LRA's black-pixel mask."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from scipy import special

from configs import lra
from simpletron_jax.data import tasks
from simpletron_jax.data.common import RaggedExamples, make_batch
from simpletron_jax.model import attention, encoders, layers
from simpletron_jax.model.attention import simple
# Parameters without running the call eagerly, and calls as one jitted program (shared by
# equal modules at the same shapes): fewer compiles than one per eager operation.
from tests.module_support import init_variables, jit_apply

B, L, E, H = 2, 10, 8, 2


def _x(length=L, seed=0, width=E):
  return np.asarray(jax.random.normal(jax.random.PRNGKey(seed), (B, length, width)))


def _mask(length=L, real=(L, L - 4)):
  return np.arange(length)[None, :] < np.asarray(real)[:, None]


def _build(name, **kwargs):
  return attention.get(name).build(num_heads=H, qkv_dim=E, out_dim=E, dropout_rate=0.0,
                                   dtype=jnp.float32, **kwargs)


def _np_proj(params, name, x):
  """``x W + b`` per head, numpy: ``[B, L, H, K]``."""
  p = params[name]
  return np.einsum("ble,ehk->blhk", x, np.asarray(p["kernel"])) + np.asarray(p["bias"])


def _np_out(params, y_BxLxHxK):
  p = params["out"]
  return np.einsum("blhk,hko->blo", y_BxLxHxK, np.asarray(p["kernel"])) + np.asarray(p["bias"])


def _authors_simple(q, k, v):
  """The authors' SimpleAttention (``kv = K^T V / sqrt(seq_len)``; ``out = Q kv``), numpy,
  per example and head, every position (pads included) counted."""
  seq_len = q.shape[1]
  kv_BxHxKxK = np.einsum("blhd,blhe->bhde", k, v) / np.sqrt(seq_len)
  return np.einsum("blhd,bhde->blhe", q, kv_BxHxKxK)


# --- SimpleAttention options -------------------------------------------------------------

@pytest.mark.parametrize("normalizer,mask_pads", [("padded", False), ("padded", True),
                                                  ("real", False)])
def test_simple_options_match_numpy(normalizer, mask_pads):
  module = _build("simple", normalizer=normalizer, mask_pads=mask_pads)
  x, mask = _x(), _mask()
  params = init_variables(module, x, mask)
  y = np.asarray(jit_apply(module)(params, x, mask)).reshape(B, L, H, E // H)
  q, k, v = (_np_proj(params["params"], n, x) for n in ("query", "key", "value"))
  m = mask[:, :, None, None] if mask_pads else np.ones_like(mask)[:, :, None, None]
  kv = np.einsum("blhd,blhe->bhde", k * m, v * m)
  ref = np.einsum("blhd,bhde->blhe", q * m, kv)
  n = np.full(B, L) if normalizer == "padded" else mask.sum(1)
  ref = ref / np.sqrt(n)[:, None, None, None]
  np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_authors_config_attention_matches_authors_formula():
  """``:tiny_authors`` attention, evaluation mode, against a transcription of the authors'
  PyTorch ``SimpleAttention.forward`` on a batch padded to ``max_length + 1``."""
  config = lra.make_config("listops", "simple", "tiny_authors")
  kwargs = dict(config.model.attention_kwargs)
  assert config.data.bucket == 0
  module = _build("simple", **kwargs)
  length = config.model.max_length + 1
  x, mask = _x(length), _mask(length, real=(30, 7))
  params = init_variables(module, x, mask, seed=2)
  y = np.asarray(jit_apply(module)(params, x, mask)).reshape(B, length, H, E // H)
  q, k, v = (_np_proj(params["params"], n, x) for n in ("query", "key", "value"))
  np.testing.assert_allclose(y, _authors_simple(q, k, v), rtol=1e-4, atol=1e-5)


def test_kv_dropout_drops_entries_of_kv():
  """In training, ``y = Q M`` with every entry of ``M`` either 0 or ``(K^T V)_ij / (1 - r)
  / sqrt(L)``: solving for ``M`` from ``y`` and ``Q`` recovers dropout on ``K^T V``."""
  rate, length = 0.5, 40
  module = _build("simple", normalizer="padded", mask_pads=False, kv_dropout_rate=rate)
  x = _x(length)
  params = init_variables(module, x, None)
  train = jax.jit(lambda params, key: module.apply(params, x, None, deterministic=False,
                                                   rngs={"dropout": key}))  # one program
  y = np.asarray(train(params, jax.random.PRNGKey(5)), np.float64)
  y = y.reshape(B, length, H, E // H)
  q, k, v = (_np_proj(params["params"], n, x).astype(np.float64)
             for n in ("query", "key", "value"))
  full = np.einsum("blhd,blhe->bhde", k, v) / (1 - rate) / np.sqrt(length)
  for b in range(B):
    for h in range(H):
      m_KxK = np.linalg.lstsq(q[b, :, h], y[b, :, h], rcond=None)[0]
      kept = np.isclose(m_KxK, full[b, h], rtol=1e-3, atol=1e-4)
      dropped = np.isclose(m_KxK, 0.0, atol=1e-4)
      assert np.all(kept | dropped)
      assert 0 < dropped.sum() < dropped.size
  eval_y = jit_apply(module)(params, x, None)  # no dropout when deterministic
  ref = _authors_simple(q, k, v).astype(np.float32)
  np.testing.assert_allclose(np.asarray(eval_y).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("block_diagonal", [False, True])
def test_kv_dropout_hook_sees_kv_before_the_query_product(block_diagonal):
  # The block-diagonal layout hands the hook the same per-head [B, H, K, K] states.
  rng = np.random.default_rng(0)
  q, k, v = (rng.normal(size=(B, L, H, 3)).astype(np.float32) for _ in range(3))
  keep_BxHxKxK = rng.random((B, H, 3, 3)) < 0.5

  def hook(kv):
    chex.assert_shape(kv, (B, H, 3, 3))
    return kv * keep_BxHxKxK

  # One program, not one per op.
  y = jax.jit(lambda q, k, v, mask: simple.simple_attention(
      q, k, v, mask, normalizer="padded", mask_pads=False, kv_dropout=hook,
      block_diagonal=block_diagonal))(q, k, v, _mask())
  kv = np.einsum("blhd,blhe->bhde", k, v) * keep_BxHxKxK
  ref = np.einsum("blhd,bhde->blhe", q, kv) / np.sqrt(L)
  np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-5, atol=1e-5)


def test_causal_padded_normalizer_matches_numpy():
  module = _build("simple", causal=True, chunk_size=3, normalizer="padded", mask_pads=False)
  x, mask = _x(), _mask()
  params = init_variables(module, x, mask)
  y = np.asarray(jit_apply(module)(params, x, mask)).reshape(B, L, H, E // H)
  q, k, v = (_np_proj(params["params"], n, x) for n in ("query", "key", "value"))
  scores = np.einsum("bihd,bjhd->bhij", q, k) * np.tril(np.ones((L, L)))
  ref = np.einsum("bhij,bjhd->bihd", scores, v) / np.sqrt(np.arange(1, L + 1))[None, :, None,
                                                                               None]
  np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)


def test_simple_option_errors():
  x = _x()
  # The inits traced only (jax.eval_shape): the errors are raised while tracing, and
  # nothing is compiled.
  with pytest.raises(ValueError, match="model.attention_kwargs.normalizer='max'"):
    jax.eval_shape(_build("simple", normalizer="max").init, jax.random.PRNGKey(0), x, None)
  with pytest.raises(ValueError, match="kv_dropout_rate > 0 needs causal=False"):
    jax.eval_shape(_build("simple", causal=True, kv_dropout_rate=0.1).init,
                   jax.random.PRNGKey(0), x, None)
  with pytest.raises(ValueError, match="block_diagonal=True needs causal=False"):
    jax.eval_shape(_build("simple", causal=True, block_diagonal=True).init,
                   jax.random.PRNGKey(0), x, None)


# --- LRA's missing padding masks -----------------------------------------------------------

def _lra_linear(q, k, v, eps=1e-6):
  """LRA ``linear_attention``: elu+1 features, every position a key."""
  phi = lambda t: np.where(t > 0, t + 1.0, np.exp(t))
  fq, fk = phi(q), phi(k)
  kv = np.einsum("nshd,nshm->nhmd", fk, v)
  z = 1.0 / (np.einsum("nlhd,nhd->nlh", fq, fk.sum(1)) + eps)
  return np.einsum("nlhd,nhmd,nlh->nlhm", fq, kv, z)


def _lra_relu_performer(q, k, v, eps=1e-3):
  """LRA's default Performer: deterministic ``relu + 0.001`` features, renormalised, no
  mask."""
  fq, fk = np.maximum(q, 0) + eps, np.maximum(k, 0) + eps
  num = np.einsum("blhm,bhmk->blhk", fq, np.einsum("blhm,blhk->bhmk", fk, v))
  return num / np.einsum("blhm,bhm->blh", fq, fk.sum(1))[..., None]


def _lra_linformer(q, k, v, e_MxR):
  """LRA ``LinformerAttention``: K and V (pads included) projected by ``E[:L]``."""
  e = e_MxR[:q.shape[1]]
  kp, vp = np.einsum("blhd,lr->brhd", k, e), np.einsum("blhd,lr->brhd", v, e)
  logits = np.einsum("blhd,brhd->bhlr", q / np.sqrt(q.shape[-1]), kp)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w = w / w.sum(-1, keepdims=True)
  return np.einsum("bhlr,brhd->blhd", w, vp)


@pytest.mark.parametrize("name,kwargs,ref", [
    ("linear", {}, _lra_linear),
    ("performer", {"kernel": "relu_deterministic"}, _lra_relu_performer),
    ("linformer", {"k": 4, "max_length": 16}, None),
])
def test_lra_masking_matches_lra_numpy(name, kwargs, ref):
  x, mask = _x(), _mask()
  module = _build(name, lra_masking=True, **kwargs)
  params = init_variables(module, x, mask)
  p = params["params"]
  y = np.asarray(jit_apply(module)(params, x, mask))
  q, k, v = (_np_proj(p, n, x) for n in ("query", "key", "value"))
  heads = (_lra_linformer(q, k, v, np.asarray(p["proj_E"])) if ref is None else ref(q, k, v))
  np.testing.assert_allclose(y, _np_out(p, heads), rtol=2e-4, atol=2e-5)
  # The default ignores pads: appending pads changes no real output; LRA's bug does.
  correct = jit_apply(_build(name, **kwargs))
  xp = np.concatenate([x, _x(3, seed=9)], axis=1)
  mp = np.concatenate([mask, np.zeros((B, 3), bool)], axis=1)
  real = mask[0]
  np.testing.assert_allclose(np.asarray(correct(params, xp, mp))[0, :L][real],
                             np.asarray(correct(params, x, mask))[0][real],
                             rtol=1e-5, atol=1e-5)
  assert not np.allclose(np.asarray(jit_apply(module)(params, xp, mp))[0, :L], y[0],
                         atol=1e-5)


def test_lra_pixel_mask_treats_black_pixels_as_padding():
  pixels = [np.array([0, 5, 0, 7], np.uint8), np.array([3, 0, 0, 1], np.uint8)]
  split = RaggedExamples.from_sequences(pixels, [0, 1], dtype=np.uint8, explicit_mask=True)
  data = tasks.data_config(lra.make_config("image", "softmax", "tiny"))
  assert data.lra_pixel_mask is False
  kept = tasks.apply_lra_pixel_mask(data, {"train": split})["train"]
  assert make_batch(kept, np.arange(2), max_length=4, bucket=0)["mask"].all()
  data = dataclasses.replace(data, lra_pixel_mask=True)
  lra_split = tasks.apply_lra_pixel_mask(data, {"train": split})["train"]
  batch = make_batch(lra_split, np.arange(2), max_length=4, bucket=0)
  np.testing.assert_array_equal(batch["mask"], np.stack(pixels) > 0)


# --- Encoder, block and head options -------------------------------------------------------

def _encoder(**kwargs):
  base = dict(vocab_size=12, emb_dim=E, num_heads=H, qkv_dim=E, mlp_dim=16, num_layers=1,
              max_length=L, attention="simple", dropout_rate=0.5, learn_pos_emb=True)
  base.update(kwargs)
  vocab_size = base.pop("vocab_size")
  return encoders.Encoder(config=encoders.ModelConfig(**base), vocab_size=vocab_size)


def _tokens():
  tokens = np.array(jax.random.randint(jax.random.PRNGKey(3), (B, L), 1, 12), np.int32)
  tokens[1, 6:] = 0
  return tokens


def _jit_apply_captured(module):
  """``module.apply(..., capture_intermediates=True)`` as one program, not one per op."""
  return jax.jit(lambda params, *args: module.apply(params, *args, capture_intermediates=True))


def test_pos_emb_init_zeros_and_zero_pad_embedding():
  tokens = _tokens()
  enc = _encoder(num_layers=0, pos_emb_init="zeros", zero_pad_embedding=True)
  params = init_variables(enc, tokens, seed=0)
  chex.assert_trees_all_equal(params["params"]["posembed"]["pos_embedding"],
                              np.zeros((L + 1, E), np.float32))
  _, state = _jit_apply_captured(enc)(params, tokens)
  embedded_BxLxE = np.asarray(state["intermediates"]["posembed"]["__call__"][0])[:, 1:]
  table = np.asarray(params["params"]["embed"]["embedding"])
  np.testing.assert_array_equal(embedded_BxLxE, np.where(tokens[..., None] > 0,
                                                         table[tokens], 0.0))
  normal = init_variables(_encoder(num_layers=0), tokens, seed=0)["params"]["posembed"]
  assert 0.01 < float(np.std(np.asarray(normal["pos_embedding"]))) < 0.03
  with pytest.raises(ValueError, match="model.pos_emb_init='ones'"):  # raised while tracing
    jax.eval_shape(_encoder(num_layers=0, pos_emb_init="ones").init, jax.random.PRNGKey(0),
                   tokens)


def test_embedding_dropout_off_and_no_final_layer_norm():
  """With no blocks, no embedding dropout and no final LN, a training-mode call returns the
  CLS embedding exactly (CLS + its position); with embedding dropout it does not."""
  tokens = _tokens()
  enc = _encoder(num_layers=0, embedding_dropout=False, final_layer_norm=False)
  params = init_variables(enc, tokens, seed=0)
  assert "encoder_norm" not in params["params"]
  p = params["params"]
  cls_E = np.asarray(p["cls"])[0, 0] + np.asarray(p["posembed"]["pos_embedding"])[0]
  dropped = _encoder(num_layers=0, final_layer_norm=False)

  @jax.jit  # both training-mode calls in one program, not one per op
  def train(params, tokens, key):
    rngs = {"dropout": key}
    return (enc.apply(params, tokens, deterministic=False, rngs=rngs),
            dropped.apply(params, tokens, deterministic=False, rngs=rngs))

  out, out_dropped = (np.asarray(y) for y in train(params, tokens, jax.random.PRNGKey(4)))
  np.testing.assert_allclose(out, np.broadcast_to(cls_E, (B, E)), rtol=1e-6)
  assert not np.allclose(out_dropped, out)


@pytest.mark.parametrize("branch_dropout", [False, True])
def test_attention_branch_dropout(branch_dropout):
  block = layers.EncoderBlock(_encoder(attention_branch_dropout=branch_dropout).config, 0)
  x, mask = _x(), _mask()
  params = init_variables(block, x, mask, seed=0, deterministic=True)
  # One program, not one per op.
  out, state = jax.jit(lambda params, x, mask, key: block.apply(
      params, x, mask, deterministic=False, rngs={"dropout": key},
      capture_intermediates=True))(params, x, mask, jax.random.PRNGKey(1))
  inter = state["intermediates"]
  attn = np.asarray(inter["attention"]["__call__"][0])
  mlp = np.asarray(inter["MlpBlock_0"]["__call__"][0])
  exact = np.allclose(np.asarray(out), x + attn + mlp, rtol=1e-5, atol=1e-5)
  assert exact != branch_dropout


def _gelu_exact(t):
  return 0.5 * t * (1.0 + special.erf(t / np.sqrt(2.0)))


def test_gelu_head_matches_numpy():
  tokens = _tokens()
  model = encoders.ClassificationEncoder(encoder=_encoder(head_activation="gelu"), num_classes=3)
  params = init_variables(model, tokens, seed=0)
  logits, state = _jit_apply_captured(model)(params, tokens)
  pooled = np.asarray(state["intermediates"]["encoder"]["__call__"][0], np.float64)
  p = params["params"]
  hidden = pooled @ np.asarray(p["head_hidden"]["kernel"]) + np.asarray(p["head_hidden"]["bias"])
  ref = (_gelu_exact(hidden) @ np.asarray(p["head_logits"]["kernel"])
         + np.asarray(p["head_logits"]["bias"]))
  np.testing.assert_allclose(np.asarray(logits), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("interaction,width", [("concat", 2), ("nli", 4)])
def test_dual_interaction_matches_numpy(interaction, width):
  tokens = _tokens()
  model = encoders.DualEncoderClassifier(encoder=_encoder(interaction=interaction),
                                         num_classes=2)
  params = init_variables(model, tokens, None, tokens[::-1], None, seed=0)
  p = params["params"]
  chex.assert_shape(p["head_hidden"]["kernel"], (width * E, 16))
  logits, state = _jit_apply_captured(model)(params, tokens, None, tokens[::-1], None)
  u, v = (np.asarray(t) for t in state["intermediates"]["encoder"]["__call__"])
  h = np.concatenate([u, v] + ([u * v, u - v] if interaction == "nli" else []), axis=-1)
  for name in ("head_hidden", "head_hidden2"):
    h = np.maximum(h @ np.asarray(p[name]["kernel"]) + np.asarray(p[name]["bias"]), 0.0)
  ref = h @ np.asarray(p["head_logits"]["kernel"]) + np.asarray(p["head_logits"]["bias"])
  np.testing.assert_allclose(np.asarray(logits), ref, rtol=1e-5, atol=1e-5)


def test_unknown_model_choices_name_the_field():
  config = lra.make_config("listops", "simple", "tiny")
  for field, bad in (("head_activation", "tanh"), ("interaction", "sum")):
    model = ml_collections.ConfigDict(config.model.to_dict())
    model[field] = bad
    with pytest.raises(ValueError, match=f"model.{field}='{bad}'"):
      encoders.build_classifier(model, vocab_size=12, num_classes=2)
