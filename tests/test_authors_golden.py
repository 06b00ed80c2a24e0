"""``:authors`` against the SimpleTRON authors' own PyTorch code (docs/fidelity.md).

The fixtures in ``tests/fixtures/authors`` were written by ``scripts/authors_golden.py`` from
the model and optimizer cells of ``lra/notebooks/listops_setup_simple_2.ipynb`` and
``lra/notebooks/bpe_matching_setup_simple_2.ipynb`` (``vladyorsh/lra_efficient_transformers``)
at a tiny size: the authors' initialised weights, a batch padded to ``max_length``, their
eval-mode logits, and the losses of 3 steps of their training loop. Here the weights are
mapped through :data:`NAME_MAP` onto our ``:tiny_authors`` model (sized to the fixture), and
the logits and losses are compared; no torch is needed.
"""

from __future__ import annotations

import json
import os
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import lra
from simpletron_jax.model import encoders
from simpletron_jax.train import run_config, steps, train_state
from tests.module_support import init_variables

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "authors")
TASKS = ("listops", "retrieval")

# Our parameter path (regex, "/"-joined) -> (the authors' state_dict name, layout).
# Layouts: "linear_qkv": nn.Linear weight [H*K, E] -> DenseGeneral kernel [E, H, K];
# "bias_qkv": [H*K] -> [H, K]; "linear": weight [out, in] -> kernel [in, out];
# "pos": [1, L, E] -> [L, E]; "same": unchanged.
NAME_MAP = (
    (r"encoder/embed/embedding", "embed_layer.embedding.weight", "same"),
    (r"encoder/posembed/pos_embedding", "embed_layer.pos_embeds", "pos"),
    (r"encoder/cls", "embed_layer.cls", "same"),
    (r"encoder/encoderblock_(\d+)/LayerNorm_0/scale", r"blocks.\1.layernorm_input.weight", "same"),
    (r"encoder/encoderblock_(\d+)/LayerNorm_0/bias", r"blocks.\1.layernorm_input.bias", "same"),
    (r"encoder/encoderblock_(\d+)/LayerNorm_1/scale", r"blocks.\1.layernorm_inter.weight", "same"),
    (r"encoder/encoderblock_(\d+)/LayerNorm_1/bias", r"blocks.\1.layernorm_inter.bias", "same"),
    (r"encoder/encoderblock_(\d+)/attention/query/kernel", r"blocks.\1.attention.q.weight",
     "linear_qkv"),
    (r"encoder/encoderblock_(\d+)/attention/query/bias", r"blocks.\1.attention.q.bias",
     "bias_qkv"),
    (r"encoder/encoderblock_(\d+)/attention/key/kernel", r"blocks.\1.attention.k.weight",
     "linear_qkv"),
    (r"encoder/encoderblock_(\d+)/attention/key/bias", r"blocks.\1.attention.k.bias", "bias_qkv"),
    (r"encoder/encoderblock_(\d+)/attention/value/kernel", r"blocks.\1.attention.v.weight",
     "linear_qkv"),
    (r"encoder/encoderblock_(\d+)/attention/value/bias", r"blocks.\1.attention.v.bias",
     "bias_qkv"),
    (r"encoder/encoderblock_(\d+)/MlpBlock_0/Dense_0/kernel", r"blocks.\1.ffn.0.weight", "linear"),
    (r"encoder/encoderblock_(\d+)/MlpBlock_0/Dense_0/bias", r"blocks.\1.ffn.0.bias", "same"),
    (r"encoder/encoderblock_(\d+)/MlpBlock_0/Dense_1/kernel", r"blocks.\1.ffn.3.weight", "linear"),
    (r"encoder/encoderblock_(\d+)/MlpBlock_0/Dense_1/bias", r"blocks.\1.ffn.3.bias", "same"),
    # TClassifier (ListOps): final LayerNorm, Linear -> GELU, output Linear.
    (r"encoder/encoder_norm/scale", "classifier.layernorm.weight", "same"),
    (r"encoder/encoder_norm/bias", "classifier.layernorm.bias", "same"),
    (r"head_hidden/kernel", "classifier.ffn.0.weight", "linear"),
    (r"head_hidden/bias", "classifier.ffn.0.bias", "same"),
    # DualClassifier (matching): Linear -> ReLU -> Linear -> ReLU -> output Linear.
    (r"head_hidden2/kernel", "classifier.ffn.2.weight", "linear"),
    (r"head_hidden2/bias", "classifier.ffn.2.bias", "same"),
    (r"head_logits/kernel", "classifier.output.weight", "linear"),
    (r"head_logits/bias", "classifier.output.bias", "same"),
)


def _load(task):
  path = os.path.join(FIXTURES, f"simple__{task}.npz")
  if not os.path.exists(path):
    pytest.fail(f"{path} is missing; run scripts/authors_golden.py --authors_src DIR "
                f"--out {FIXTURES}")
  data = dict(np.load(path))
  return data, json.loads(str(data["hparams"]))


def _config(task, hp, dropout=True):
  """``:tiny_authors`` sized to the fixture, with the notebook's optimizer values."""
  config = lra.make_config(task, "simple", "tiny_authors")
  m = config.model
  m.emb_dim = m.qkv_dim = hp["emb_dim"]
  m.num_heads, m.mlp_dim, m.num_layers = hp["num_heads"], hp["mlp_dim"], hp["num_layers"]
  m.max_length = hp["max_length"]
  if not dropout:   # the fixture's training ran with every dropout rate 0
    m.dropout_rate = m.attention_dropout_rate = 0.0
    m.attention_kwargs.kv_dropout_rate = 0.0
  config.learning_rate, config.weight_decay = hp["lr"], hp["weight_decay"]
  config.warmup = hp["warmup"]
  config.adam_b1, config.adam_b2 = hp["betas"]
  config.adam_eps = hp["eps"]
  config.factors = "constant * linear_warmup * rsqrt_decay"
  config.grad_accum_steps = 1
  return config


def _model(task, config, hp):
  return encoders.build_classifier(config.model, vocab_size=hp["vocab"],
                                   num_classes=hp["classes"], dual=task == "retrieval")


def _flat(tree, prefix=""):
  out = {}
  for key, value in tree.items():
    path = f"{prefix}/{key}" if prefix else key
    out.update(_flat(value, path) if isinstance(value, dict) else {path: value})
  return out


def _unflat(flat):
  tree = {}
  for path, value in flat.items():
    node = tree
    *parents, leaf = path.split("/")
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = value
  return tree


def _authors_name(path):
  for pattern, name, layout in NAME_MAP:
    match = re.fullmatch(pattern, path)
    if match:
      return match.expand(name), layout
  raise KeyError(f"{path}: no entry in NAME_MAP")


def _convert(array, layout, shape):
  if layout == "linear_qkv":
    return array.T.reshape(shape)
  if layout == "linear":
    return array.T
  if layout in ("bias_qkv", "pos"):
    return array.reshape(shape)
  return array


def _params(task, model, data, hp):
  """Our initialised tree with every leaf replaced by the authors' weight; asserts that
  the two trees have the same leaves and shapes."""
  tokens = jnp.asarray(data["inputs"])
  second = (tokens, None) if task == "retrieval" else ()
  ours = _flat(jax.device_get(init_variables(model, tokens, None, *second, seed=0)["params"]))
  theirs = {k[len("param/"):]: v for k, v in data.items() if k.startswith("param/")}
  mapped, used = {}, set()
  for path, leaf in ours.items():
    name, layout = _authors_name(path)
    assert name in theirs, f"{path} -> {name}: not in the authors' state_dict"
    value = _convert(theirs[name], layout, leaf.shape)
    assert value.shape == leaf.shape, (path, name, value.shape, leaf.shape)
    mapped[path] = value
    used.add(name)
  assert used == set(theirs), f"authors' weights left unmapped: {sorted(set(theirs) - used)}"
  return _unflat(mapped), ours


def _batch(task, data, prefix, step=None):
  pick = (lambda a: a) if step is None else (lambda a: a[step])
  x = pick(data[f"{prefix}inputs"])
  batch = {"inputs": jnp.asarray(x), "mask": jnp.asarray(x > 0)}
  if task == "retrieval":
    x2 = pick(data[f"{prefix}inputs2"])
    batch.update(inputs2=jnp.asarray(x2), mask2=jnp.asarray(x2 > 0))
  return batch


def _logits(task, model, params, batch):
  second = (batch["inputs2"], batch["mask2"]) if task == "retrieval" else ()
  return np.asarray(model.apply({"params": params}, batch["inputs"], batch["mask"], *second,
                                deterministic=True))


@pytest.mark.parametrize("task", TASKS)
def test_parameter_tree_and_logits_match_the_authors(task):
  data, hp = _load(task)
  config = _config(task, hp)
  model = _model(task, config, hp)
  params, _ = _params(task, model, data, hp)
  logits = _logits(task, model, params, _batch(task, data, ""))
  np.testing.assert_allclose(logits, data["logits"], rtol=0, atol=1e-4)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("warmup_key", ["train_losses", "train_losses_warm2"])
def test_three_training_losses_match_the_authors(task, warmup_key):
  """3 steps of our steps.loss_fn + make_optimizer against the notebook's loop
  (AdamW, LambdaLR(get_schedule(warmup)), CrossEntropyLoss), dropout 0; with the notebook's
  warmup and with warmup 2, where the steps move the weights by ~lr."""
  data, hp = _load(task)
  config = _config(task, hp, dropout=False)
  if warmup_key == "train_losses_warm2":
    config.warmup = hp["warmup2"]
  model = _model(task, config, hp)
  params, _ = _params(task, model, data, hp)
  tx = train_state.make_optimizer(run_config.TrainConfig.from_config_dict(config))
  opt_state = tx.init(params)

  @jax.jit
  def step(params, opt_state, batch):
    (loss, _), grads = jax.value_and_grad(steps.loss_fn, has_aux=True)(
        params, model.apply, batch, jax.random.PRNGKey(0), False)
    updates, opt_state = tx.update(grads, opt_state, params)
    return jax.tree_util.tree_map(lambda p, u: p + u, params, updates), opt_state, loss

  losses = []
  for i in range(len(data[warmup_key])):
    batch = _batch(task, data, "train_", i)
    batch.update(targets=jnp.asarray(data["train_targets"][i]),
                 weights=jnp.ones(data["train_targets"].shape[1], jnp.float32))
    params, opt_state, loss = step(params, opt_state, batch)
    losses.append(float(loss))
  np.testing.assert_allclose(losses, data[warmup_key], rtol=0, atol=1e-5)


@pytest.mark.parametrize("task", TASKS)
def test_paper_authors_config_has_the_notebook_optimizer(task):
  """``:authors`` (paper size) trains with the notebook's optimizer: AdamW at its lr, weight
  decay, betas and eps, LRA's rsqrt schedule (the notebook's get_schedule) at its warmup,
  and 32 examples a step (the notebook's 4 x 8 accumulated micro-batches)."""
  _, hp = _load(task)
  config = lra.make_config(task, "simple", "authors")
  assert (config.learning_rate, config.weight_decay, config.warmup) == (
      hp["lr"], hp["weight_decay"], hp["warmup"])
  assert [config.adam_b1, config.adam_b2] == hp["betas"] and config.adam_eps == hp["eps"]
  assert config.factors == "constant * linear_warmup * rsqrt_decay"
  assert config.batch_size * 1 == 32


@pytest.mark.parametrize("task", TASKS)
def test_torch_init_matches_the_authors_distribution(task):
  """``model.dense_init="torch"``: every Linear kernel and bias of ours lies in
  ``+-1/sqrt(fan_in)`` and spreads as the uniform does (std ``1/sqrt(3 fan_in)``), as the
  authors' initial weights do."""
  data, hp = _load(task)
  config = _config(task, hp)
  model = _model(task, config, hp)
  _, ours = _params(task, model, data, hp)
  checked = 0
  for path, leaf in ours.items():
    name, layout = _authors_name(path)
    if layout not in ("linear", "linear_qkv", "bias_qkv") and not (
        path.endswith("/bias") and "LayerNorm" not in path and "norm" not in path):
      continue
    theirs = data[f"param/{name}"]
    fan_in = theirs.shape[1] if theirs.ndim == 2 else data[f"param/{name[:-4]}weight"].shape[1]
    bound = 1.0 / np.sqrt(fan_in)
    for values in (np.asarray(leaf), theirs):
      assert np.abs(values).max() <= bound * (1 + 1e-6), (path, name)
      if values.size >= 32:   # P(max < 0.75 bound) = 0.75**32 = 1e-4 (seeded: fixed)
        assert np.abs(values).max() > 0.75 * bound, (path, name)
    if leaf.size >= 512:
      assert abs(np.std(leaf) / (bound / np.sqrt(3)) - 1) < 0.15, path
    checked += 1
  assert checked >= 10


def test_lra_configs_keep_lra_init_and_gelu():
  config = lra.make_config("listops", "simple")
  assert (config.model.mlp_activation, config.model.cls_position, config.model.dense_init) == (
      "gelu_tanh", True, "lra")


@pytest.mark.parametrize("field,value", [("mlp_activation", "relu"), ("cls_position", "no"),
                                         ("dense_init", "xavier")])
def test_bad_choices_name_the_field(field, value):
  model = lra.make_config("listops", "simple", "tiny_authors").model.to_dict()
  model[field] = value   # a plain dict: ConfigDict refuses a value of another type
  with pytest.raises(ValueError, match=f"model.{field}="):
    encoders.ModelConfig.from_config_dict(ml_collections.ConfigDict(model))
