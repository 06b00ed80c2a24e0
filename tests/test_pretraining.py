"""Self-pretraining (simpletron_jax/train/pretraining.py): masking, the token-level loss, the LM
model, the ``:spt`` configs, and fine-tuning from a pretrained encoder."""

import json
import os

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from configs import lra
from simpletron_jax.data import batches, tasks
from simpletron_jax.experiments import recipes
from simpletron_jax.model import encoders, transfer
from simpletron_jax.train import evaluation, pretraining, run_config, steps, trainer
from tests.module_support import init_variables
from tests.test_train import Killed, _final_params, majority_split, tiny_config


def _spt_config(objective="mlm", attention="simple", **overrides):
  config = tiny_config(attention, **overrides)
  config.pretrain = pretraining.default_config(objective)
  return config


def _build(config, **sizes):
  """``pretraining.build_model`` of ``config``'s typed model and ``pretrain`` section."""
  run = run_config.RunConfig.from_config_dict(config)
  return pretraining.build_model(run.model, run.pretrain, **sizes)


def _batch(rng, b=4, length=12):
  tokens = rng.integers(1, 16, size=(b, length)).astype(np.int32)
  lengths = rng.integers(3, length + 1, size=b)
  mask = np.arange(length)[None] < lengths[:, None]
  tokens = np.where(mask, tokens, 0)
  return tokens, mask


def test_mask_tokens_is_seeded_and_never_selects_pads():
  tokens, mask = _batch(np.random.default_rng(0), b=64, length=40)
  keys = jax.random.split(jax.random.PRNGKey(1), 64)
  a_in, a_sel = pretraining.mask_tokens(keys, tokens, mask, 0.5, 16)
  b_in, b_sel = pretraining.mask_tokens(keys, tokens, mask, 0.5, 16)
  np.testing.assert_array_equal(a_sel, b_sel)
  np.testing.assert_array_equal(a_in, b_in)
  _, c_sel = pretraining.mask_tokens(jax.random.split(jax.random.PRNGKey(2), 64), tokens,
                                     mask, 0.5, 16)
  assert not np.array_equal(a_sel, c_sel), "another key must draw another mask"
  a_sel, a_in = np.asarray(a_sel), np.asarray(a_in)
  assert not a_sel[~mask].any(), "a pad was selected as a target"
  np.testing.assert_array_equal(a_in[a_sel], 16)
  np.testing.assert_array_equal(a_in[~a_sel], tokens[~a_sel])
  rate = a_sel[mask].mean()
  assert 0.45 < rate < 0.55, rate   # ~1,400 real tokens at rate 0.5


def test_eval_keys_depend_on_the_row_only():
  tokens, _ = _batch(np.random.default_rng(0), b=6)
  keys = np.asarray(pretraining.eval_row_keys(tokens))
  keys_reordered = np.asarray(pretraining.eval_row_keys(tokens[::-1]))
  np.testing.assert_array_equal(keys[::-1], keys_reordered)
  assert len({tuple(k) for k in keys}) == 6


def _lm(config, vocab=16):
  model = _build(config, vocab_size=vocab, num_classes=2)
  tokens = jnp.ones((1, 8), jnp.int32)
  params = init_variables(model, tokens, None, deterministic=True, seed=0)["params"]
  return model, params


def _sums(metrics):
  """The weighted sums a step's ``steps.Metrics`` hold: ``{"loss", "accuracy", "count"}``."""
  return {"loss": metrics.loss.total, "accuracy": metrics.accuracy.total,
          "count": metrics.loss.count}


def test_loss_counts_only_masked_real_tokens_numpy_reference():
  config = _spt_config()
  model, params = _lm(config)
  tokens, mask = _batch(np.random.default_rng(3), b=4)
  batch = {"inputs": tokens, "mask": mask, "targets": np.zeros(4, np.int32),
           "weights": np.array([1, 1, 1, 0], np.float32)}   # the last row is a filler
  rng = jax.random.PRNGKey(5)
  # one program for the three losses and one for the forward pass, not one per operation
  loss_fn = jax.jit(lambda p, r: steps.loss_fn(p, model.apply, batch, r, False))
  loss, metrics = loss_fn(params, rng)
  sums = _sums(metrics)
  out = jax.jit(lambda p: model.apply(
      {"params": p}, tokens, mask, deterministic=False,
      rngs={"dropout": rng, "random_features": jax.random.fold_in(rng, 0x5EED)}))(params)
  logits = np.asarray(out["logits"], np.float64)
  sel = np.asarray(out["weights"]) > 0
  assert not sel[~mask].any() and sel.any()
  sel[3] = False   # the filler row counts nothing
  logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
      - logits.max(-1, keepdims=True)
  nll = -np.take_along_axis(logp, tokens[..., None], -1)[..., 0]
  np.testing.assert_allclose(float(sums["count"]), sel.sum())
  np.testing.assert_allclose(float(sums["loss"]), nll[sel].sum(), rtol=1e-5)
  np.testing.assert_allclose(float(loss), nll[sel].mean(), rtol=1e-5)
  np.testing.assert_allclose(float(sums["accuracy"]), (logits.argmax(-1) == tokens)[sel].sum())
  # the mask is a pure function of the step's key: the same key masks the same tokens
  _, again = loss_fn(params, rng)
  chex.assert_trees_all_equal(metrics, again)
  other = _sums(loss_fn(params, jax.random.PRNGKey(6))[1])
  assert float(other["count"]) != float(sums["count"]) or float(other["loss"]) != float(
      sums["loss"])


def test_pads_are_never_targets_in_the_model_and_eval_is_deterministic():
  model, params = _lm(_spt_config())
  tokens, mask = _batch(np.random.default_rng(4), b=8, length=20)
  apply = jax.jit(lambda p, t, m: model.apply({"params": p}, t, m, deterministic=True))
  out = apply(params, tokens, mask)   # one program, not one per operation
  weights = np.asarray(out["weights"])
  assert weights.shape == tokens.shape and out["logits"].shape == (8, 20, 17)
  assert not weights[~mask].any() and weights[mask].any()
  again = apply(params, tokens, mask)
  np.testing.assert_array_equal(weights, np.asarray(again["weights"]))


def test_pretraining_lowers_the_masked_token_loss():
  config = _spt_config(**{"model.dropout_rate": 0.0, "model.attention_dropout_rate": 0.0})
  model, params = _lm(config)
  rng = np.random.default_rng(0)
  # a learnable language: every row repeats a 3-token motif
  motifs = rng.integers(1, 16, size=(32, 3))
  tokens = np.tile(motifs, (1, 5)).astype(np.int32)
  batch = {"inputs": tokens, "mask": tokens > 0, "targets": np.zeros(32, np.int32),
           "weights": np.ones(32, np.float32)}
  tx = optax.adam(3e-3)
  opt = tx.init(params)

  @jax.jit
  def step(params, opt, key):
    (loss, _), grads = jax.value_and_grad(steps.loss_fn, has_aux=True)(
        params, model.apply, batch, key, False)
    updates, opt = tx.update(grads, opt)
    return optax.apply_updates(params, updates), opt, loss

  eval_metrics = jax.jit(   # one program for both evaluations
      lambda p: steps.loss_fn(p, model.apply, batch, jax.random.PRNGKey(0), True)[1])

  def eval_loss(params):
    return steps.means(eval_metrics(params))["loss"]

  before = eval_loss(params)
  for i in range(60):
    params, opt, _ = step(params, opt, jax.random.PRNGKey(i))
  after = eval_loss(params)
  assert after < 0.7 * before, (before, after)


def test_fine_tuning_starts_from_the_pretrained_encoder_exactly():
  spt = _spt_config()
  model, params = _lm(spt)
  ft = _spt_config("none")
  clf = _build(ft, vocab_size=16, num_classes=2)
  assert isinstance(clf, encoders.ClassificationEncoder)
  target = init_variables(clf, jnp.ones((1, 8), jnp.int32), None, deterministic=True,
                          seed=1)["params"]
  copied, report = transfer.transfer_params(params, target)
  assert sorted(report.new) == ["head_hidden/bias", "head_hidden/kernel",
                                "head_logits/bias", "head_logits/kernel"]
  assert all(p.startswith("lm_") for p in report.dropped)
  assert "encoder/embed/embedding" in report.copied   # the [MASK] row is reserved in both
  src, out = transfer.flatten(params), transfer.flatten(copied)
  for path in report.copied:
    assert path.startswith("encoder/")
    np.testing.assert_array_equal(np.asarray(out[path]), np.asarray(src[path]))
  assert len(report.copied) == len([p for p in src if p.startswith("encoder/")])


def test_tied_head_uses_the_embedding():
  config = _spt_config()
  config.pretrain.tie_head = True
  model, params = _lm(config)
  assert "lm_logits" not in params and params["lm_bias"].shape == (17,)
  tokens, mask = _batch(np.random.default_rng(1))
  out = jax.jit(lambda p: model.apply({"params": p}, tokens, mask, deterministic=True))(params)
  assert out["logits"].shape == (4, 12, 17)


def test_lm_head_is_one_dense_by_default_and_mlp_adds_berts_transform():
  tokens, mask = _batch(np.random.default_rng(1))
  config = _spt_config()
  assert config.pretrain.lm_head == "linear"   # the SPT code's decoder
  model, params = _lm(config)
  assert sorted(k for k in params if k != "encoder") == ["lm_logits"]
  config.pretrain.lm_head = "mlp"
  model_mlp, params_mlp = _lm(config)
  assert sorted(k for k in params_mlp if k != "encoder") == ["lm_logits", "lm_norm",
                                                             "lm_transform"]
  # same encoder, different head: the logits differ, their shapes do not
  shared = {**params_mlp, "encoder": params["encoder"]}
  # both heads in one program, not one per operation
  a, b = jax.jit(lambda p, p_mlp: [
      m.apply({"params": q}, tokens, mask, deterministic=True)["logits"]
      for m, q in ((model, p), (model_mlp, p_mlp))])(params, shared)
  assert a.shape == b.shape == (4, 12, 17) and not np.allclose(a, b)
  config.pretrain.lm_head = "deep"
  with pytest.raises(ValueError, match="pretrain.lm_head"):
    _build(config, vocab_size=16, num_classes=2)


def test_next_token_targets_and_causal_check():
  tokens = np.array([[3, 4, 5, 0], [6, 7, 0, 0]], np.int32)
  targets, weights = pretraining.next_token_targets(tokens, tokens > 0)
  np.testing.assert_array_equal(targets, [[4, 5, 0, 0], [7, 0, 0, 0]])
  np.testing.assert_array_equal(weights, [[1, 1, 0, 0], [1, 0, 0, 0]])
  with pytest.raises(ValueError, match="pretrain.objective='causal'"):
    _build(_spt_config("causal"), vocab_size=16, num_classes=2)
  config = _spt_config("causal", attention="aft_simple")
  config.model.attention_kwargs = ml_collections.ConfigDict({"causal": True})
  model, params = _lm(config)
  out = jax.jit(lambda p: model.apply({"params": p}, tokens, tokens > 0, deterministic=True))(
      params)   # one program, not one per operation
  np.testing.assert_array_equal(out["targets"], targets)


def test_bad_pretrain_fields_are_named():
  for field, value, match in (("objective", "bert", "pretrain.objective"),
                              ("mask_rate", 0.0, "pretrain.mask_rate"),
                              ("mask_token", False, "pretrain.mask_token")):
    config = _spt_config()
    config.pretrain[field] = value
    with pytest.raises(ValueError, match=match):
      _build(config, vocab_size=16, num_classes=2)
  with pytest.raises(ValueError, match="retrieval"):
    _build(_spt_config(), vocab_size=16, num_classes=2, dual=True)


def test_encoder_states_are_one_per_token():
  config = tiny_config()
  encoders.ModelConfig.from_config_dict(config.model)
  encoder = encoders.build_encoder(config.model, vocab_size=16, return_states=True)
  tokens, mask = _batch(np.random.default_rng(2))
  params = init_variables(encoder, tokens, mask, seed=0)
  pooling = encoders.build_encoder(config.model, vocab_size=16)
  # both applies in one program, not one per operation
  states, pooled = jax.jit(lambda p: (encoder.apply(p, tokens, mask),
                                      pooling.apply(p, tokens, mask)))(params)
  assert states.shape == (4, 12, config.model.emb_dim)
  assert pooled.shape == (4, config.model.emb_dim)


def test_spt_config_variants():
  config = lra.make_config("listops", "linear", "tiny_spt")
  assert config.pretrain.objective == "mlm" and config.pretrain.mask_rate == 0.5
  tiny = lra.make_config("listops", "linear", "tiny")
  assert config.model.to_dict() == tiny.model.to_dict()
  assert config.num_train_steps == tiny.num_train_steps
  assert lra.make_config("text", "simple", "tiny_spt_ft").pretrain.objective == "none"
  assert "pretrain" not in tiny
  with pytest.raises(ValueError, match="unknown config variant"):
    lra.make_config("retrieval", "simple", "tiny_spt")


def test_paper_size_spt_configs_train_with_the_spt_codes_recipe():
  spt = lra.make_config("listops", "softmax", "spt")
  ft = lra.make_config("listops", "softmax", "spt_ft")
  paper = lra.make_config("listops", "softmax")
  assert spt.model.num_layers == paper.model.num_layers   # LRA's encoder is kept
  for config, stage in ((spt, "spt"), (ft, "ft")):
    recipe = recipes.get("listops").pretraining[stage]
    assert (config.learning_rate, config.weight_decay, config.warmup, config.batch_size) == (
        recipe.learning_rate, recipe.weight_decay, recipe.warmup, recipe.batch_size)
    assert config.num_train_steps == 96000 // recipe.batch_size * recipe.epochs == 300000
    assert config.factors == "constant * linear_warmup" and config.grad_clip_norm == 0
    assert config.model.dropout_rate == config.model.attention_dropout_rate == 0
  text = lra.make_config("text", "simple", "spt_ft")
  assert (text.weight_decay, text.warmup, text.num_train_steps) == (0.1, 2000, 781 * 65)
  assert lra.make_config("pathx", "linear", "spt").grad_clip_norm == 0   # LRA's clips
  tiny = lra.make_config("listops", "softmax", "tiny_spt")
  assert tiny.learning_rate == lra.make_config("listops", "softmax", "tiny").learning_rate
  with pytest.raises(ValueError, match="config.task='retrieval'"):
    pretraining.apply_paper_recipe(lra.make_config("retrieval", "simple"), "spt")


@pytest.mark.slow
def test_spt_run_resumes_exactly_and_fine_tunes(presence_task, tmp_path):
  config = _spt_config(num_train_steps=6, checkpoint_every=3, eval_frequency=3, warmup=1,
                       **{"data.bucket": 0, "model.max_length": 24, "model.num_layers": 1})
  straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
  first = trainer.train_and_evaluate(config, straight, data=presence_task)
  assert 0 <= first["test_accuracy_best_val"] <= 1

  def kill_at_4(step):
    if step == 4:
      raise Killed()

  with pytest.raises(Killed):
    trainer.train_and_evaluate(config, resumed, step_hook=kill_at_4, data=presence_task)
  trainer.train_and_evaluate(config, resumed, data=presence_task)
  chex.assert_trees_all_equal(_final_params(resumed, config, presence_task),
                              _final_params(straight, config, presence_task))
  ft = _spt_config("none", num_train_steps=2, checkpoint_every=2, eval_frequency=2, warmup=1,
                   init_from=straight,
                   **{"data.bucket": 0, "model.max_length": 24, "model.num_layers": 1})
  trainer.train_and_evaluate(ft, str(tmp_path / "ft"), data=presence_task)
  with open(tmp_path / "ft" / "transfer.json") as f:
    report = json.load(f)
  assert sorted(report["new"]) == ["head_hidden/bias", "head_hidden/kernel",
                                   "head_logits/bias", "head_logits/kernel"]
  assert os.path.isdir(tmp_path / "ft" / "checkpoints")


def test_reference_rows_match_their_papers_averages():
  from simpletron_jax.experiments import published  # pylint: disable=import-outside-toplevel
  # each source's "Avg" (LRU's paper gives none: the mean of its six cells, rounded as
  # they are): a check on every transcribed cell
  averages = {"Transformer + Rotary + masked SPT": 86.21, "Transformer + causal SPT": 81.81,
              "S4": 86.09, "S5": 87.46, "Mega": 88.21, "LRU": 86.3}
  assert sorted(averages) == sorted(r.model for r in published.REFERENCES)
  for ref in published.REFERENCES:
    assert len(ref.accuracies) == len(tasks.lra_tasks())
    assert round(ref.average, 2) == averages[ref.model], ref.model
    assert ref.checked, f"{ref.model}: say how its cells were checked"
  assert published.references("pathx")[0][1] == 92.98
  with pytest.raises(ValueError, match="task"):
    published.references("cifar")


@pytest.mark.parametrize("task", ["image", "pathfinder"])
def test_pixel_tasks_predict_the_256_values_with_an_explicit_mask(task):
  config = lra.make_config(task, "linear", "tiny_spt")
  config.model.max_length = 16
  model = _build(config, vocab_size=256, num_classes=2)
  tokens = np.random.default_rng(0).integers(0, 256, (2, 16))
  tokens[0] = 0   # an all-black row: every pixel is real
  tokens = jnp.asarray(tokens, jnp.int32)
  mask = jnp.ones((2, 16), bool)   # pixel value 0 is real

  @jax.jit   # init and apply in one program, not one per operation
  def init_and_apply(key):
    params = model.init({"params": key}, tokens, mask, deterministic=True)["params"]
    return params, model.apply({"params": params}, tokens, mask, deterministic=True)
  params, out = init_and_apply(jax.random.PRNGKey(0))
  assert out["logits"].shape == (2, 16, 257)
  # black pixels are targets too: the mask, not the id, decides
  assert np.asarray(out["weights"])[0].sum() > 0
  assert params["encoder"]["embed"]["embedding"].shape[0] == 257


def test_spt_script_arms_share_the_fine_tuning_recipe():
  import importlib.util  # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location(
      "spt_script", os.path.join(os.path.dirname(__file__), "..", "scripts", "spt.py"))
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  # One override syntax, train.py's: --config.* for every run, --spt_config.* for pretraining.
  parsed = script.parse_args(["--tasks", "listops", "--config.data.bucket=8",
                              "--spt_config.learning_rate", "0.001", "--seeds", "1",
                              "--workdir_root", "/tmp/unused"])
  assert parsed.config_overrides == ["--config.data.bucket=8"]
  assert parsed.spt_overrides == ["--config.learning_rate=0.001"]
  assert (parsed.tasks, parsed.seeds) == (["listops"], [1])
  assert script.parse_args(["--size", "tiny"]).workdir_root == os.path.join(
      script.ROOT, "runs", "spt_tiny")   # under runs/ by default, never results/
  with pytest.raises(SystemExit):   # the retired --set / --spt-set say what to write instead
    script.parse_args(["--spt-set", "learning_rate=0.001"])
  args = ("listops", "linear", "tiny")
  spt = script.stage_config(*args, "spt", 1, 50, None, ["--config.learning_rate=1e-3",
                                                         "--config.data.bucket=8"])
  assert spt.data.bucket == 8 and isinstance(spt.learning_rate, float)
  ft = script.stage_config(*args, "ft", 1, 40, None, [], init_from="/runs/spt")
  scratch = script.stage_config(*args, "scratch", 1, 40, None, [])
  assert spt.pretrain.objective == "mlm" and spt.learning_rate == 1e-3
  assert ft.pretrain.objective == "none" and ft.init_from == "/runs/spt"
  assert "pretrain" not in scratch and not scratch.init_from
  for field in ("learning_rate", "num_train_steps", "warmup", "batch_size", "seed"):
    assert ft[field] == scratch[field], field
  assert ft.model.to_dict() == scratch.model.to_dict()
  with pytest.raises(ValueError, match="no field 'learning_rat' \\(did you mean "
                     "'learning_rate'\\?\\)"):
    script.stage_config(*args, "spt", 1, 50, None, ["--config.learning_rat=1e-3"])
  # the paper size: both arms take the SPT code's fine-tuning recipe and its step count
  ft = script.stage_config("text", "linear", "", "ft", 0, None, None, [], init_from="/r")
  scratch = script.stage_config("text", "linear", "", "scratch", 0, None, None, [])
  for field in ("learning_rate", "num_train_steps", "warmup", "batch_size", "weight_decay",
                "factors", "eval_frequency"):
    assert ft[field] == scratch[field], field
  assert ft.model.dropout_rate == scratch.model.dropout_rate == 0


def test_spt_evaluation_majority_rate_counts_the_class_labels_not_the_tokens():
  task, config = majority_split(), _spt_config(eval_batch_size=8)
  model = _build(config, vocab_size=16, num_classes=task.num_classes)
  params = init_variables(model, jnp.ones((1, 8), jnp.int32), None, deterministic=True,
                          seed=0)["params"]
  _, p_eval = steps.pmap_steps(model.apply)
  result = evaluation.evaluate(p_eval, steps.replicate(params), task.test,
                               batches.BatchConfig.from_config_dict(config))
  assert result["majority_rate"] == np.bincount(task.test.labels).max() / 21   # 9 / 21
  assert result["count"] > 21   # loss and accuracy are per masked token
