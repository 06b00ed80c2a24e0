"""BERT's encoder as a configuration of ours, and Hugging Face checkpoints loaded into it
(issue 30; SimpleTRON section 5.3).

The parity test is what makes "SimpleTRON's blocks have BERT's weights" true here: a tiny BERT
made with ``transformers`` (random weights, every one perturbed so that a swapped LayerNorm
or a transposed kernel shows) and saved to a temporary folder, loaded into our softmax
encoder, gives ``transformers``' hidden states (every position, pads included) and pooled
output to 1e-5 in float32. It skips without ``transformers`` and ``torch`` (the ``torch``
test extra).
"""

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import lra
from simpletron_jax.experiments import recipes
from simpletron_jax.model import encoders, layers, transfer
from simpletron_jax.model.attention.simple import SimpleAttention
from simpletron_jax.runtime import errors
from simpletron_jax.tools import bert_import
from simpletron_jax.train import saved_runs
from tests.module_support import init_variables

# The tiny BERT of the parity test: 2 blocks, width 32, 4 heads.
SIZES = {"vocab_size": 50, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 64, "max_position_embeddings": 24}
MAX_LENGTH = 16


def tiny_bert_config(attention="softmax", num_layers=2, **fields):
  """The ``configs/agnews`` tiny config at :data:`SIZES`, with ``fields`` (``model.*``)."""
  config = lra.make_config("agnews", attention, "tiny")
  model = config.model
  model.emb_dim = model.qkv_dim = SIZES["hidden_size"]
  model.num_heads = SIZES["num_attention_heads"]
  model.mlp_dim = SIZES["intermediate_size"]
  model.num_layers = num_layers
  model.max_length = MAX_LENGTH
  model.max_positions = SIZES["max_position_embeddings"]
  for key, value in fields.items():
    model[key] = value
  return config


def init_params(config, real=False):
  """``(model, params)``; the params are zeros of the right shapes (no compile) unless
  ``real``."""
  model = encoders.build_classifier(config.model, vocab_size=SIZES["vocab_size"], num_classes=4)
  tokens = jnp.ones((1, MAX_LENGTH), jnp.int32)
  if real:
    return model, init_variables(model, tokens, seed=0)["params"]
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), tokens)["params"]
  return model, jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), shapes)


def tokens_with_padding():
  """``[3, 16]`` ids: a full row, one padded after 10 tokens, one after 3; [CLS]-like id 2
  first (BERT's ids are arbitrary here)."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, SIZES["vocab_size"], (3, MAX_LENGTH))
  tokens[:, 0] = 2
  tokens[1, 10:] = 0
  tokens[2, 3:] = 0
  return tokens


@pytest.fixture(scope="module")
def hf_bert(tmp_path_factory):
  """``(folder, BertModel)``: a perturbed random tiny BERT saved as model.safetensors."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  torch.manual_seed(0)
  config = transformers.BertConfig(**SIZES, attn_implementation="eager")
  model = transformers.BertModel(config).eval()
  with torch.no_grad():
    for param in model.parameters():
      param.add_(0.3 * torch.randn_like(param))
  folder = tmp_path_factory.mktemp("tiny_bert")
  model.save_pretrained(str(folder))
  assert os.path.isfile(folder / "model.safetensors")
  return str(folder), model


def _hf_outputs(model, tokens):
  import torch  # pylint: disable=import-outside-toplevel
  with torch.no_grad():
    out = model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(tokens > 0).long(),
                output_hidden_states=True)
  return [h.numpy() for h in out.hidden_states], out.pooler_output.numpy()


def _our_outputs(model, params, tokens):
  """Embeddings, each block's output and the pooled vector of our encoder."""
  apply = jax.jit(lambda p, t: model.apply({"params": p}, t, capture_intermediates=True,
                                           mutable=["intermediates"]))
  _, state = apply(params, jnp.asarray(tokens))
  seen = state["intermediates"]["encoder"]
  hidden = [seen["embed_norm"]["__call__"][0]] + [
      seen[f"encoderblock_{i}"]["__call__"][0] for i in range(SIZES["num_hidden_layers"])]
  return [np.asarray(h) for h in hidden], np.asarray(seen["__call__"][0])


def _old_style_bin(folder, model, tmp_path):
  """The same weights as a ``BertForPreTraining``-style pytorch_model.bin: ``bert.``
  prefixes, LayerNorm ``gamma``/``beta``, an MLM head tensor; config.json copied."""
  import torch  # pylint: disable=import-outside-toplevel
  state = {}
  for name, value in model.state_dict().items():
    name = "bert." + name.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
        "LayerNorm.bias", "LayerNorm.beta")
    state[name] = value
  state["cls.predictions.bias"] = torch.zeros(SIZES["vocab_size"])
  out = tmp_path / "old_style"
  out.mkdir()
  torch.save(state, out / "pytorch_model.bin")
  (out / "config.json").write_text((open(os.path.join(folder, "config.json")).read()))
  return str(out)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["safetensors", "pytorch_bin"])
def test_loaded_softmax_encoder_matches_transformers(hf_bert, tmp_path, fmt):
  folder, hf_model = hf_bert
  if fmt == "pytorch_bin":
    folder = _old_style_bin(folder, hf_model, tmp_path)
  config = tiny_bert_config()
  model, params = init_params(config, real=True)
  loaded, report = bert_import.import_bert(folder, params)
  assert report.new == ["head_logits/bias", "head_logits/kernel"]
  assert report.dropped == (["hf:cls.predictions.bias"] if fmt == "pytorch_bin" else [])
  assert len(report.copied) == 5 + 16 * SIZES["num_hidden_layers"] + 2
  tokens = tokens_with_padding()
  hf_hidden, hf_pooled = _hf_outputs(hf_model, tokens)
  ours_hidden, ours_pooled = _our_outputs(model, loaded, tokens)
  assert len(ours_hidden) == len(hf_hidden) == 3
  for i, (ours, theirs) in enumerate(zip(ours_hidden, hf_hidden)):
    assert ours.shape == theirs.shape == (3, MAX_LENGTH, SIZES["hidden_size"])
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0, err_msg=f"hidden state {i}")
  np.testing.assert_allclose(ours_pooled, hf_pooled, atol=1e-5, rtol=0)
  # Before the copy the encoder computes something else: the comparison can fail.
  assert np.abs(_our_outputs(model, params, tokens)[1] - hf_pooled).max() > 1e-2


def test_import_report_for_simpletron_attentions_and_depth(hf_bert):
  folder, _ = hf_bert
  checkpoint = bert_import.read_checkpoint(folder)
  blocks = range(SIZES["num_hidden_layers"])
  out_paths = [f"encoder/encoderblock_{i}/attention/out/{leaf}"
               for i in blocks for leaf in ("bias", "kernel")]
  # Simple-Res has no output projection: BERT's is dropped, and nothing else is new.
  _, simple_res = init_params(tiny_bert_config("simple_res"))
  params, report = bert_import.import_bert(checkpoint, simple_res)
  assert report.dropped == out_paths
  assert report.new == ["head_logits/bias", "head_logits/kernel"]
  np.testing.assert_array_equal(
      params["encoder"]["encoderblock_1"]["attention"]["query"]["kernel"],
      checkpoint.tensors["encoder.layer.1.attention.self.query.weight"].T.reshape(32, 4, 8))
  # Simple-ResL takes every BERT weight.
  _, simple_resl = init_params(tiny_bert_config("simple_resl"))
  assert bert_import.import_bert(checkpoint, simple_resl)[1].dropped == []
  # One block takes BERT's first; the second block's weights are dropped.
  _, one_block = init_params(tiny_bert_config("simple_resl", num_layers=1))
  _, report = bert_import.import_bert(checkpoint, one_block)
  assert report.dropped and all(p.startswith("encoder/encoderblock_1/") for p in report.dropped)
  assert len(report.dropped) == 16


def test_import_refuses_other_sizes_naming_paths(hf_bert):
  _, params = init_params(tiny_bert_config(num_heads=2))
  with pytest.raises(ValueError, match=r"attention/query/kernel: source \(32, 4, 8\) vs "
                                       r"target \(32, 2, 16\)"):
    bert_import.import_bert(hf_bert[0], params)


def test_check_model_config_names_what_is_not_bert(hf_bert):
  checkpoint = bert_import.read_checkpoint(hf_bert[0])
  assert bert_import.check_model_config(checkpoint.config, tiny_bert_config().model) == []
  assert bert_import.check_model_config(checkpoint.config,
                                        tiny_bert_config(num_layers=1).model) == []
  other = tiny_bert_config(layer_norm_epsilon=1e-6, block_norm="pre").model
  assert bert_import.check_model_config(checkpoint.config, other) == [
      "model.block_norm: config 'pre', checkpoint 'post'",
      "model.layer_norm_epsilon: config 1e-06, checkpoint 1e-12"]


def test_save_as_run_is_read_by_init_from(hf_bert, tmp_path):
  checkpoint = bert_import.read_checkpoint(hf_bert[0])
  out = str(tmp_path / "converted")
  bert_import.main([hf_bert[0], out])
  # init_from reads and checks the checkpoint as it reads a run's best.
  restored = saved_runs.load_run(out).params()
  expected = bert_import.convert(checkpoint)[0]
  flat_restored, flat_expected = transfer.flatten(restored), transfer.flatten(expected)
  assert sorted(flat_restored) == sorted(flat_expected)
  for path, value in flat_expected.items():
    np.testing.assert_array_equal(np.asarray(flat_restored[path]), value, err_msg=path)
  assert json.load(open(os.path.join(out, "bert_import.json")))["unused"] == []
  with pytest.raises(FileExistsError, match="checkpoints exists"):
    bert_import.save_as_run(checkpoint, out)
  # Saving into a folder that holds a checkpoint never passes silently.
  with pytest.raises(errors.CheckpointError, match="already holds a checkpoint"):
    saved_runs.save_params(out, expected, {})


def test_read_checkpoint_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="config.json and one of model.safetensors or "
                                              "pytorch_model.bin"):
    bert_import.read_checkpoint(str(tmp_path))
  config = {"hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 1,
            "intermediate_size": 64, "vocab_size": 10}
  with pytest.raises(ValueError, match="model_type='roberta'"):
    bert_import.check_bert_config({**config, "model_type": "roberta"})
  with pytest.raises(ValueError, match="hidden_act='relu'"):
    bert_import.check_bert_config({**config, "hidden_act": "relu"})
  with pytest.raises(ValueError, match="num_attention_heads=5"):
    bert_import.check_bert_config({**config, "num_attention_heads": 5})
  bert_import.check_bert_config(config)


def test_post_norm_simple_res_block_is_ln_of_both_skips():
  """Post-LN with SimpleTRON's double skip: ``x1 = LN0(x0 + Attn(x0))``,
  ``out = LN1(x1 + MLP(x1) + x0)``, checked against the block's own submodules."""
  config = encoders.ModelConfig(emb_dim=16, num_heads=2, qkv_dim=16, mlp_dim=32, num_layers=1,
                                max_length=5, attention="simple_res", block_norm="post",
                                layer_norm_epsilon=1e-12, attention_bias=True)
  block = layers.EncoderBlock(config, 0)
  x0 = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 16))
  mask = jnp.array([[True] * 5, [True] * 3 + [False] * 2])
  norm = nn.LayerNorm(epsilon=1e-12)

  @jax.jit
  def run(x0):
    params = block.init(jax.random.PRNGKey(1), x0, mask, deterministic=True)["params"]
    out = block.apply({"params": params}, x0, mask, deterministic=True)
    attn = SimpleAttention(num_heads=2, qkv_dim=16, out_dim=16).apply(
        {"params": params["attention"]}, x0, mask)
    x1 = norm.apply({"params": params["LayerNorm_0"]}, x0 + attn)
    mlp = layers.MlpBlock(config).apply({"params": params["MlpBlock_0"]}, x1, deterministic=True)
    expected = norm.apply({"params": params["LayerNorm_1"]}, x1 + mlp + x0)
    without_skip = norm.apply({"params": params["LayerNorm_1"]}, x1 + mlp)
    return params, out, expected, without_skip

  params, out, expected, without_skip = run(x0)
  assert sorted(params) == ["LayerNorm_0", "LayerNorm_1", "MlpBlock_0", "attention"]
  np.testing.assert_allclose(np.asarray(out), np.asarray(expected), atol=1e-6)
  assert np.abs(np.asarray(out) - np.asarray(without_skip)).max() > 1e-3


def test_bert_embeddings_have_no_cls_vector_and_lra_defaults_are_unchanged():
  _, params = init_params(tiny_bert_config())
  assert sorted(params["encoder"]) == ["embed", "embed_norm", "encoderblock_0",
                                       "encoderblock_1", "pooler", "posembed",
                                       "token_type_embedding"]
  assert params["encoder"]["posembed"]["pos_embedding"].shape == (24, 32)
  no_types = init_params(tiny_bert_config(type_vocab_size=0))[1]
  assert "token_type_embedding" not in no_types["encoder"]
  lra_params = init_params(lra.make_config("listops", "softmax", "tiny"))[1]
  assert not {"embed_norm", "pooler", "token_type_embedding"} & set(lra_params["encoder"])
  assert "cls" in lra_params["encoder"]


def test_mlp_hidden_dropout_option():
  """BERT's MLP (``mlp_hidden_dropout=False``) drops out its output only: every kept output
  entry is twice the undropped one at rate 0.5. LRA's also thins the hidden layer, so the
  kept entries differ from it."""
  x = jax.random.normal(jax.random.PRNGKey(2), (2, 3, 8))
  for hidden_dropout in (False, True):
    mlp = layers.MlpBlock(encoders.ModelConfig(
        emb_dim=8, num_heads=1, qkv_dim=8, mlp_dim=64, num_layers=1, max_length=3,
        dropout_rate=0.5, mlp_hidden_dropout=hidden_dropout))

    @jax.jit
    def run(x, mlp=mlp):
      params = mlp.init(jax.random.PRNGKey(1), x, deterministic=True)
      return (mlp.apply(params, x, deterministic=True),
              mlp.apply(params, x, deterministic=False, rngs={"dropout": jax.random.PRNGKey(0)}))

    full, dropped = (np.asarray(y) for y in run(x))
    kept = dropped != 0
    assert 0 < kept.mean() < 1
    output_only = np.allclose(dropped[kept], 2 * full[kept], atol=1e-5)
    assert output_only == (not hidden_dropout)


@pytest.mark.parametrize("field,value,match", [
    ("block_norm", "middle", "model.block_norm='middle'"),
    ("embedding_type", "gpt", "model.embedding_type='gpt'"),
    ("pooler", "yes", "model.pooler=.yes."),
    ("max_positions", 8, "model.max_positions=8 is shorter than model.max_length=16"),
    ("type_vocab_size", -1, "model.type_vocab_size=-1"),
    ("layer_norm_epsilon", 0.0, "model.layer_norm_epsilon=0.0"),
])
def test_bad_bert_fields_are_named(field, value, match):
  model = tiny_bert_config().model.to_dict()
  model[field] = value
  with pytest.raises(ValueError, match=match):
    encoders.ModelConfig.from_config_dict(ml_collections.ConfigDict(model))


def test_agnews_configs_are_bert_base():
  for attention in ("softmax", "simple_resl"):
    config = lra.make_config("agnews", attention)
    m = config.model
    assert (m.num_layers, m.emb_dim, m.num_heads, m.mlp_dim, m.max_length, m.max_positions) == (
        12, 768, 12, 3072, 128, 512)
    assert (m.embedding_type, m.block_norm, m.pooler, m.classifier_pool, m.learn_pos_emb,
            m.mlp_activation) == ("bert", "post", True, "CLS", True, "gelu_exact")
    assert config.init_from == ""
    assert lra.make_config("agnews", attention, "from_bert").init_from == recipes.AGNEWS_FROM_BERT
  assert lra.variants("agnews", "simple_resl") == ("tiny", "from_bert", "tiny_from_bert")
