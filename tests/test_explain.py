"""Issue 33: the attention maps and token relevance of ``simpletron_jax/tools/explain.py`` and
``scripts/explain.py``.

* the maps the modules sow are exact: for Simple, Simple-Res, Simple-ResL, linear and the
  Performer, ``A V`` (per head, then the output projection) is the module's output in
  float32, pad rows included, and pads get zero weight; for softmax the sown weights are the
  ones the module multiplies with V;
* the value Jacobian (the map of the other variants) equals the sown maps where both exist,
  and the Random Synthesizer's softmax of its learned logits;
* gradient x input matches a finite difference;
* the train step compiles to the same program with and without the sow (nothing when not
  asked for); the maps appear only under ``mutable=[base.MAPS]``;
* the script draws every task kind and runs end to end on a trained checkpoint.
"""

import importlib.util
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simpletron_jax.model import attention, encoders
from simpletron_jax.model.attention import base
from simpletron_jax.tools import explain
from simpletron_jax.train import run_config, steps, train_state, trainer
from tests.module_support import init_variables

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
E, H = 8, 2   # width and heads of the module-level tests


def _script():
  spec = importlib.util.spec_from_file_location("explain_script",
                                                os.path.join(ROOT, "scripts", "explain.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _inputs(length=9, real=6):
  """``x [2, L, E]`` and a mask whose second row has ``L - real`` pads at the end."""
  x = jax.random.normal(jax.random.PRNGKey(0), (2, length, E), jnp.float32)
  mask = jnp.array([[True] * length, [True] * real + [False] * (length - real)])
  return x, mask


def _module(name, **kwargs):
  return attention.get(name).build(num_heads=H, qkv_dim=E, out_dim=E, dropout_rate=0.0,
                                   dtype=jnp.float32, use_bias=True, **kwargs)


def _apply_with_map(module, params, x, mask):
  y, state = module.apply({"params": params}, x, mask, mutable=[base.MAPS])
  (a_BxHxNxL,) = state[base.MAPS]["map"]
  return y, a_BxHxNxL


def _output_from_map(params, a_BxHxNxL, x, out_proj: bool):
  """``A V`` per head, through the output projection when the module has one."""
  v = jnp.einsum("ble,ehk->blhk", x, params["value"]["kernel"]) + params["value"]["bias"]
  y = jnp.einsum("bhij,bjhk->bihk", a_BxHxNxL, v, precision="highest")
  if out_proj:
    return jnp.einsum("blhk,hko->blo", y, params["out"]["kernel"]) + params["out"]["bias"]
  return y.reshape(*y.shape[:2], -1)


IMPLICIT_CASES = [
    ("simple", {}, True),
    ("simple", {"causal": True, "chunk_size": 4}, True),
    ("simple", {"block_diagonal": True}, True),
    ("simple", {"normalizer": "padded", "mask_pads": False}, False),   # the authors' function
    ("simple_res", {}, True),
    ("simple_resl", {}, True),
    ("linear", {}, True),
    ("linear", {"causal": True, "chunk_size": 4}, True),
    ("performer", {}, True),
    ("performer", {"kernel": "relu_deterministic"}, True),
]


@pytest.mark.parametrize("name,kwargs,pads_masked", IMPLICIT_CASES,
                         ids=[f"{n}-{'-'.join(f'{k}={v}' for k, v in kw.items()) or 'default'}"
                              for n, kw, _ in IMPLICIT_CASES])
def test_implicit_map_times_values_is_the_modules_output(name, kwargs, pads_masked):
  x, mask = _inputs()
  module = _module(name, **kwargs)
  params = init_variables(module, x, mask)["params"]
  out_proj = name in ("simple_resl", "linear", "performer")

  @jax.jit   # one program, not one per operation
  def outputs(params):
    y, a = _apply_with_map(module, params, x, mask)
    _, a_short = _apply_with_map(module, params, x[1:, :6], mask[1:, :6])
    return y, a, _output_from_map(params, a, x, out_proj), a_short
  y, a, y_from_map, a_short = outputs(params)
  assert a.shape == (2, H, 9, 9) and a.dtype == jnp.float32
  # Every row, the pad rows of the second example included.
  np.testing.assert_allclose(y_from_map, y, rtol=2e-5, atol=2e-6)
  if pads_masked:
    assert float(jnp.abs(a[1, :, :, 6:]).max()) == 0.0   # pads get exactly zero weight
    # The real positions' map does not depend on the padding.
    np.testing.assert_allclose(a[1, :, :6, :6], a_short[0], rtol=1e-5, atol=1e-6)
  else:
    assert float(jnp.abs(a[1, :, :, 6:]).max()) > 0.0    # the authors' pads are keys


def test_simple_map_is_q_dot_k_over_sqrt_length():
  """The map of the paper, written out: ``A_ij = q_i . k_j / sqrt(L)``, L the real tokens."""
  x, mask = _inputs()
  module = _module("simple")
  params = init_variables(module, x, mask)["params"]
  _, a = _apply_with_map(module, params, x, mask)
  q = np.einsum("le,ehk->lhk", x[1, :6], params["query"]["kernel"]) + params["query"]["bias"]
  k = np.einsum("le,ehk->lhk", x[1, :6], params["key"]["kernel"]) + params["key"]["bias"]
  expected = np.einsum("ihk,jhk->hij", q, k) / np.sqrt(6.0)
  np.testing.assert_allclose(a[1, :, :6, :6], expected, rtol=1e-5, atol=1e-6)


class _WeightsSpy:
  """Interceptor: the input of the attention's weight dropout, i.e. the weights the module
  multiplies with V (``softmax.einsum_attention``)."""

  def __init__(self):
    self.weights = []

  def __call__(self, next_fun, args, kwargs, context):
    if isinstance(context.module, nn.Dropout) and context.method_name == "__call__":
      self.weights.append(args[0])
    return next_fun(*args, **kwargs)


SOFTMAX_CASES = [{}, {"causal": True}, {"lra_masking": True}, {"num_queries": 1}]


@pytest.mark.parametrize("kwargs", SOFTMAX_CASES,
                         ids=["-".join(f"{k}={v}" for k, v in kw.items()) or "default"
                              for kw in SOFTMAX_CASES])
def test_softmax_sown_weights_are_the_modules_weights(kwargs):
  x, mask = _inputs()
  module = attention.get("softmax").build(num_heads=H, qkv_dim=E, out_dim=E, dropout_rate=0.1,
                                          dtype=jnp.float32, use_bias=True, **kwargs)
  params = init_variables(module, x, mask)["params"]

  @jax.jit   # one program, not one per operation; the spy's weights come out with the map
  def outputs(params):
    spy = _WeightsSpy()
    with nn.intercept_methods(spy):
      y, a = _apply_with_map(module, params, x, mask)
    return y, a, spy.weights, _output_from_map(params, a, x, True)
  y, a, weights, y_from_map = outputs(params)
  (used,) = weights
  np.testing.assert_array_equal(a, used)
  n = kwargs.get("num_queries") or 9
  assert a.shape == (2, H, n, 9)
  np.testing.assert_allclose(a.sum(-1), 1.0, rtol=1e-6)
  if not kwargs.get("lra_masking"):   # LRA's mask lets a pad query spread over the pads
    assert float(jnp.abs(a[1, :, :, 6:]).max()) == 0.0
  np.testing.assert_allclose(y_from_map, y, rtol=2e-5, atol=2e-6)


def test_softmax_xla_implementation_sows_the_einsum_weights():
  x, mask = _inputs()
  einsum, xla = _module("softmax"), _module("softmax", implementation="xla")
  params = init_variables(einsum, x, mask)["params"]

  @jax.jit   # one program, not one per operation
  def outputs(params):
    _, a = _apply_with_map(einsum, params, x, mask)
    y_xla, a_xla = _apply_with_map(xla, params, x, mask)
    return a, y_xla, a_xla, _output_from_map(params, a_xla, x, True)
  a, y_xla, a_xla, y_from_map = outputs(params)
  np.testing.assert_array_equal(a, a_xla)
  np.testing.assert_allclose(y_from_map, y_xla, rtol=2e-5, atol=2e-6)


def test_maps_come_out_only_when_asked():
  x, mask = _inputs()
  module = _module("simple")
  variables = init_variables(module, x, mask)
  assert set(variables) == {"params"}   # init sows nothing
  y, state = module.apply(variables, x, mask, mutable=[base.MAPS])
  assert state[base.MAPS]["map"][0].shape == (2, H, 9, 9)
  # Not asked for: no L x L array is even traced.
  plain = jax.jit(lambda v: module.apply(v, x, mask)).lower(variables).as_text()
  asked = jax.jit(lambda v: module.apply(v, x, mask, mutable=[base.MAPS])).lower(
      variables).as_text()
  assert "2x2x9x9xf32" not in plain and "2x2x9x9xf32" in asked
  np.testing.assert_array_equal(module.apply(variables, x, mask), y)


# ----------------------------------------------------------------------------
# The classifier: value Jacobian, relevance, the train step.


def _classifier(per_layer, dual=False, **attention_kwargs):
  encoder = encoders.Encoder(config=encoders.ModelConfig(
      emb_dim=E, num_heads=H, qkv_dim=E, mlp_dim=16, num_layers=len(per_layer), max_length=12,
      attention=per_layer[0], attention_per_layer=tuple(per_layer),
      attention_kwargs=attention_kwargs, learn_pos_emb=True), vocab_size=16)
  if dual:
    return encoders.DualEncoderClassifier(encoder=encoder, num_classes=3)
  return encoders.ClassificationEncoder(encoder=encoder, num_classes=3)


def _batch(dual=False):
  tokens = np.array([[3, 5, 7, 2, 11, 4, 6, 9, 0, 0, 0, 0]], np.int32)
  batch = {"inputs": tokens, "mask": tokens > 0}
  if dual:
    second = np.array([[8, 1, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0]], np.int32)
    batch.update(inputs2=second, mask2=second > 0)
  return batch


def _params(model, batch):
  return init_variables(model, *explain.model_args(batch), seed=2)["params"]


@pytest.mark.slow
def test_value_jacobian_equals_the_sown_maps():
  model = _classifier(("softmax", "simple"))
  batch = _batch()
  params = _params(model, batch)
  # each under jit: one program, not one per operation
  _, sown = jax.jit(lambda p: explain.sown_maps(model.apply, p, batch))(params)
  jac = jax.jit(lambda p: explain.value_jacobian_maps(model.apply, p, batch))(params)
  assert sorted(sown) == sorted(jac) == [(0, 0), (1, 0)]
  for key in sown:
    assert jac[key].shape == sown[key].shape == (1, H, 13, 13)
    np.testing.assert_allclose(jac[key], sown[key], rtol=1e-5, atol=1e-6)


def test_value_jacobian_of_the_random_synthesizer_is_its_softmax():
  model = _classifier(("synthesizer_random",), max_length=13)
  batch = _batch()
  params = _params(model, batch)
  # under jit: one program, not one per operation
  (jac,) = jax.jit(lambda p: explain.value_jacobian_maps(model.apply, p, batch))(
      params).values()
  logits = np.asarray(params["encoder"]["encoderblock_0"]["attention"]["random_logits"],
                      np.float64)
  keep = np.concatenate([[True], batch["mask"][0]])   # CLS, then the tokens
  logits = np.where(keep[None, None, :], logits, -np.inf)
  expected = np.exp(logits - logits.max(-1, keepdims=True))
  expected /= expected.sum(-1, keepdims=True)
  np.testing.assert_allclose(jac[0], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_explain_dual_encoder_gives_both_documents():
  model = _classifier(("simple", "local"), dual=True)
  batch = _batch(dual=True)
  params = _params(model, batch)
  ex = explain.explain(model, model.apply, params, batch)
  assert [(m.block, m.document, m.method) for m in ex.maps] == [
      (0, 0, "implicit_exact"), (0, 1, "implicit_exact"),
      (1, 0, "value_jacobian"), (1, 1, "value_jacobian")]
  assert [r.shape for r in ex.relevance] == [(12,), (12,)] and ex.offset == 1
  for m in ex.maps:   # pads (after 8 and 4 real tokens, CLS first) get zero weight
    real = 1 + int(batch["mask" if m.document == 0 else "mask2"][0].sum())
    assert float(np.abs(m.weights[:, :, real:]).max()) == 0.0
  logits = model.apply({"params": params}, *explain.model_args(batch))
  np.testing.assert_allclose(ex.logits, logits[0], rtol=1e-6)
  assert ex.predicted == ex.target == int(np.argmax(ex.logits))


def test_gradient_x_input_matches_a_finite_difference():
  """``R_j = x_j . d logit / d x_j`` is the derivative of the logit when the embedding of
  token j alone is scaled by ``1 + t``, at ``t = 0``."""
  model = _classifier(("softmax", "simple"))
  batch = _batch()
  params = _params(model, batch)
  (relevance,) = explain.gradient_x_input(model.apply, params, batch, target=1)
  args = explain.model_args(batch)

  class Scale:
    """Multiplies the token embeddings by ``scale_L`` position by position."""

    def __init__(self, scale_L):
      self.scale_L = scale_L

    def __call__(self, next_fun, a, kw, context):
      out = next_fun(*a, **kw)
      if context.module.name == "embed" and context.method_name == "__call__":
        out = out * self.scale_L[None, :, None]
      return out

  @jax.jit
  def logit(scale_L):
    with nn.intercept_methods(Scale(scale_L)):
      return model.apply({"params": params}, *args)[0, 1]

  t = 1e-2
  for j in (0, 4):
    step = np.zeros(12, np.float32)
    step[j] = t
    finite = (float(logit(1.0 + step)) - float(logit(1.0 - step))) / (2 * t)
    assert relevance[j] == pytest.approx(finite, rel=2e-2, abs=1e-4)
  assert np.abs(relevance[:8]).max() > 0


@pytest.mark.slow
def test_train_step_program_is_unchanged_by_the_sow(monkeypatch):
  """The train step of ``steps.pmap_steps`` lowers to the same program whether or not
  the modules call ``base.sow_map``: the train step does not ask for the maps."""
  from configs.listops import simple as simple_config   # pylint: disable=import-outside-toplevel
  config = simple_config.get_config("tiny")
  config.model.attention_per_layer = ("softmax", "simple", "linear", "performer")
  config.model.num_layers = 4
  config.model.emb_dim = config.model.qkv_dim = 16
  config.model.mlp_dim = 16
  config.model.max_length = 16
  model = encoders.build_classifier(config.model, vocab_size=16, num_classes=10)
  n = jax.local_device_count()
  # Lowering needs the state's shapes only (replicated: a leading device axis); nothing is
  # initialized or compiled.
  state = jax.tree.map(
      lambda s: jax.ShapeDtypeStruct((n, *s.shape), s.dtype),
      jax.eval_shape(lambda key: train_state.create_train_state(
          run_config.TrainConfig.from_config_dict(config), model, key,
          config.model.max_length), jax.random.PRNGKey(0)))
  p_train, _ = steps.pmap_steps(model.apply)
  tokens = np.ones((n, 2, 16), np.int32)
  tokens[:, 1, 10:] = 0
  batch = {"inputs": tokens, "mask": tokens > 0, "targets": np.zeros((n, 2), np.int32),
           "weights": np.ones((n, 2), np.float32)}

  def program():
    jax.clear_caches()   # trace again: the cache would hand back the first program
    return p_train.lower(state, batch, jax.random.PRNGKey(0)).as_text()

  calls = []
  real_sow = base.sow_map
  monkeypatch.setattr(base, "sow_map", lambda m, c: calls.append(1) or real_sow(m, c))
  with_sow = program()
  assert len(calls) >= 4   # every layer's module called it while tracing
  monkeypatch.setattr(base, "sow_map", lambda m, c: False)
  without_sow = program()
  assert with_sow == without_sow


# ----------------------------------------------------------------------------
# The script.


def _fake_explanation(tokens, heads=2, layers=1, signed=True, offset=1):
  """An :class:`explain.Explanation` of made-up numbers over the inputs ``tokens`` (one
  ``[L]`` array per document, pads included), as :func:`explain.explain` returns it. Each map
  is ``q(t_i) . k(t_j)`` of the tokens' ids, like a first Simple layer's."""
  rng = np.random.default_rng(0)
  lengths = [len(t) for t in tokens]
  maps = []
  for block in range(layers):
    for d, ids in enumerate(tokens):
      ids = np.concatenate([np.zeros(offset, np.int64), ids])
      q, k = rng.normal(size=(2, heads, 257, 8))
      w = np.einsum("hir,hjr->hij", q[:, ids], k[:, ids]).astype(np.float32)
      maps.append(explain.LayerMap(block, d, "simple" if signed else "softmax",
                                   "implicit_exact" if signed else "softmax_weights",
                                   w if signed else np.abs(w)))
  return explain.Explanation(np.array([0.1, 0.7, -0.2], np.float32), 1, 1,
                             [rng.normal(size=n).astype(np.float32) for n in lengths], maps,
                             offset)


@pytest.mark.parametrize("task", ["listops", "text", "retrieval", "image", "pathfinder",
                                  "agnews"])
def test_script_draws_every_task_kind(task, tmp_path):
  script = _script()
  vocab = [f"w{i}" for i in range(257)] if task == "agnews" else None   # WordPiece strings
  if task in ("image", "pathfinder"):
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 256, size=(1, 1024)).astype(np.int32)
    batch = {"inputs": tokens, "mask": np.ones_like(tokens, bool)}
    ex = _fake_explanation([tokens[0]], offset=int(task == "image"), signed=task == "image")
  else:
    size = 16 if task == "listops" else 257
    tokens = np.random.default_rng(1).integers(1, size, size=(1, 300)).astype(np.int32)
    tokens[0, 250:] = 0
    batch = {"inputs": tokens, "mask": tokens > 0}
    documents = [tokens[0]]
    if task == "retrieval":
      batch.update(inputs2=tokens[:, ::-1].copy(), mask2=tokens[:, ::-1] > 0)
      documents.append(batch["inputs2"][0])
    ex = _fake_explanation(documents, layers=2)
  meta = {"task": task, "attention": "simple", "split": "test", "index": 0, "label": 1}
  path = str(tmp_path / f"{task}.png")
  script.draw(ex, batch, task, meta, path, vocab)
  size = os.path.getsize(path)
  assert 10_000 < size < 300_000
  rec = script.record(ex, batch, task, meta, vocab)
  json.dumps(rec)
  if vocab is not None:
    assert rec["relevance"]["documents"][0]["tokens"][:2] == [
        f"w{t}" for t in batch["inputs"][0, :2]]
  assert len(rec["relevance"]["documents"]) == len(ex.relevance)
  assert len(rec["maps"]) == len(ex.maps)
  first = rec["relevance"]["documents"][0]
  assert len(first["relevance"]) == first["length"] == int(batch["mask"][0].sum())
  row = rec["maps"][0]["heads"][0]["pooled_row"]
  assert len(row) == first["length"] + ex.offset
  if ex.offset:   # the CLS query's row, real keys only
    np.testing.assert_allclose(row, ex.maps[0].weights[0, 0, :len(row)], rtol=1e-3)


def test_script_index_and_count():
  script = _script()
  assert script.example_indices(None, None, 10) == [0]
  assert script.example_indices(3, None, 10) == [3]
  assert script.example_indices(None, 4, 10) == [0, 1, 2, 3]
  assert script.example_indices(7, 3, 10) == [7, 8, 9]
  with pytest.raises(ValueError, match="--index 8 and --count 3"):
    script.example_indices(8, 3, 10)
  with pytest.raises(ValueError, match="--count 0"):
    script.example_indices(None, 0, 10)


@pytest.mark.slow
def test_script_end_to_end_on_a_trained_run(presence_task, tmp_path, monkeypatch):
  from configs.listops import simple as simple_config   # pylint: disable=import-outside-toplevel
  from simpletron_jax.data import tasks  # pylint: disable=import-outside-toplevel
  config = simple_config.get_config("tiny")
  config.model.emb_dim = config.model.qkv_dim = 16
  config.model.mlp_dim = 16
  config.model.max_length = 40
  # no dropout: the train step compiles without the masks' random bits; the maps and
  # relevance are computed without dropout anyway
  config.model.dropout_rate = config.model.attention_dropout_rate = 0.0
  config.data.bucket = 8
  config.batch_size = 16
  config.num_train_steps = 2
  config.warmup = 1
  config.eval_frequency = config.checkpoint_every = 2
  config.num_eval_steps = config.num_test_steps = 1
  workdir = str(tmp_path / "run")
  trainer.train_and_evaluate(config, workdir, data=presence_task)
  monkeypatch.setattr(tasks, "load_task", lambda c: presence_task)
  script = _script()
  out = str(tmp_path / "out")
  assert script.main(["--workdir", workdir, "--index", "3", "--count", "2", "--out", out,
                      "--save_maps"]) == 0
  names = sorted(os.listdir(out))
  assert names == [f"listops_simple_test_{i}.{ext}" for i in (3, 4)
                   for ext in ("json", "npz", "png")]
  with open(os.path.join(out, "listops_simple_test_3.json"), encoding="utf-8") as f:
    rec = json.load(f)
  assert rec["label"] == int(presence_task.test.labels[3])
  assert rec["checkpoint_step"] == 2 and len(rec["maps"]) == 2
  assert {m["method"] for m in rec["maps"]} == {"implicit_exact"}
  assert rec["relevance"]["documents"][0]["length"] == len(presence_task.test.example(3))
  assert all(os.path.getsize(os.path.join(out, n)) < 300_000 for n in names)
  with pytest.raises(SystemExit, match="explain.py: --index 500"):
    script.main(["--workdir", workdir, "--index", "500", "--out", out])
