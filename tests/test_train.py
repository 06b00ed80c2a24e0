"""Training: pmap equivalence, bucketed padding, gradient accumulation, checkpoint
round trips, resuming after a kill, and a tiny run that learns."""

import json
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.listops import simple as simple_config
from simpletron_jax.data import batches, common, tasks
from simpletron_jax.data.common import make_batch
from simpletron_jax.runtime import errors
from simpletron_jax.train import (checkpoints, evaluation, loop, precompile, run_config, steps,
                                  train_state, trainer)


def tiny_config(attention="simple", **overrides):
  config = simple_config.get_config("tiny")
  config.model.attention = attention
  config.model.emb_dim = config.model.qkv_dim = 16
  config.model.mlp_dim = 32
  config.model.num_heads = 2
  config.model.max_length = 40
  config.data.bucket = 8
  config.batch_size = 16
  config.warmup = 20
  config.learning_rate = 0.05
  config.log_every = 2
  for key, value in overrides.items():
    target = config
    *path, leaf = key.split(".")
    for part in path:
      target = target[part]
    target[leaf] = value
  return config


def _state(config, task):
  run = run_config.RunConfig.from_config_dict(config)
  model = train_state.build_model(run, task)
  return model, train_state.create_train_state(run.train, model, jax.random.PRNGKey(0),
                                               config.model.max_length)


def test_pmap_on_two_devices_equals_one_device(presence_task):
  assert jax.local_device_count() == 2, "conftest must force 2 CPU devices"
  config = tiny_config(**{"model.dropout_rate": 0.0, "model.attention_dropout_rate": 0.0})
  model, state = _state(config, presence_task)
  batch = make_batch(presence_task.train, np.arange(16), max_length=40, bucket=8)
  rng = jax.random.PRNGKey(3)
  results = []
  for n in (1, 2):
    p_train, _ = steps.pmap_steps(model.apply, devices=jax.local_devices()[:n])
    new_state, out = p_train(steps.replicate(state, jax.local_devices()[:n]),
                             steps.shard(batch, n), rng)
    results.append((steps.unreplicate(new_state).params,
                    steps.means(jax.device_get(steps.unreplicate(out["metrics"])))))
  (params_1, sums_1), (params_2, sums_2) = results
  chex.assert_trees_all_close(params_1, params_2, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(sums_1, sums_2, rtol=1e-5)
  assert sums_2["count"] == 16   # psummed over both devices


@pytest.mark.parametrize("attention", ["softmax", "simple", "simple_resl"])
def test_bucket_padding_gives_same_loss_and_grads_as_max_length(presence_task, attention):
  config = tiny_config(attention)
  model, state = _state(config, presence_task)
  idx = np.flatnonzero(presence_task.train.lengths < 25)[:8]  # mixed lengths, all short
  bucketed = make_batch(presence_task.train, idx, max_length=40, bucket=8)
  full = make_batch(presence_task.train, idx, max_length=40, bucket=0)
  assert bucketed["inputs"].shape[1] < full["inputs"].shape[1] == 40
  grad_fn = jax.jit(lambda params, batch: jax.value_and_grad(steps.loss_fn, has_aux=True)(
      params, model.apply, batch, jax.random.PRNGKey(0), True))
  (loss_b, _), grads_b = grad_fn(state.params, bucketed)
  (loss_f, _), grads_f = grad_fn(state.params, full)
  np.testing.assert_allclose(float(loss_b), float(loss_f), rtol=1e-6)
  chex.assert_trees_all_close(grads_b, grads_f, rtol=1e-4, atol=1e-6)


def _backend_compiles(fn):
  """``(fn(), number of XLA backend compilations fn caused)``."""
  names = []
  listener = lambda name, *_, **__: names.append(name)
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    result = fn()
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  return result, names.count("/jax/core/compile/backend_compile_duration")


def test_gradient_accumulation_equals_one_big_batch_and_compiles_once(presence_task):
  # An MLP width no other test uses: the steps are this test's own, so the first call
  # compiles (jax.clear_caches() would also do, but then the rest of the worker's tests
  # lower every program again).
  config = tiny_config(**{"model.dropout_rate": 0.0, "model.attention_dropout_rate": 0.0,
                          "model.mlp_dim": 24})
  model, _ = _state(config, presence_task)
  batch = make_batch(presence_task.train, np.arange(16), max_length=40, bucket=0)
  halves = [{k: v[i * 8:(i + 1) * 8] for k, v in batch.items()} for i in range(2)]
  devices = jax.local_devices()[:1]
  p_train, _ = steps.pmap_steps(model.apply, devices=devices)
  params, compiles = [], []
  for accum, micro_batches in ((1, [batch]), (2, halves)):
    config.grad_accum_steps = accum
    state = steps.replicate(train_state.create_train_state(
        run_config.TrainConfig.from_config_dict(config), model, jax.random.PRNGKey(0),
        config.model.max_length), devices)
    for b in micro_batches:
      (state, _), n = _backend_compiles(
          lambda: p_train(state, steps.shard(b, 1), jax.random.PRNGKey(1)))
      compiles.append(n)
    params.append(steps.unreplicate(state).params)
  chex.assert_trees_all_close(params[0], params[1], rtol=1e-5, atol=1e-6)
  # Each batch shape compiles once: the state a step returns (steps.replicate's layout)
  # must not compile the step again, as flax.jax_utils.replicate's did.
  assert compiles[0] >= 1 and compiles[1] >= 1 and compiles[2] == 0, compiles


def test_checkpoint_round_trip(presence_task, tmp_path):
  config = tiny_config(grad_accum_steps=2)
  model, state = _state(config, presence_task)
  state = state.replace(params=jax.tree_util.tree_map(lambda p: p + 0.5, state.params),
                        step=jnp.asarray(7))
  manager = checkpoints.checkpoint_manager(str(tmp_path / "ckpt"), 2)
  checkpoints.save_checkpoint(manager, 3, state, {"best_val_accuracy": 0.25})
  manager.wait_until_finished()
  _, fresh = _state(config, presence_task)
  restored, meta, step = checkpoints.restore_checkpoint(manager, fresh)
  assert step == 3 and meta["best_val_accuracy"] == 0.25 and int(restored.step) == 7
  chex.assert_trees_all_equal(restored.params, state.params)
  chex.assert_trees_all_equal(restored.opt_state, state.opt_state)


class Killed(Exception):
  pass


def _final_params(workdir, config, task):
  _, state = _state(config, task)
  manager = checkpoints.checkpoint_manager(os.path.join(workdir, "checkpoints"), 2)
  return checkpoints.restore_checkpoint(manager, state)[0].params


def test_killed_run_resumes_to_the_same_parameters(presence_task, tmp_path):
  config = tiny_config(num_train_steps=7, checkpoint_every=3, eval_frequency=4, grad_accum_steps=2,
                       **{"data.bucket": 0, "model.max_length": 24, "model.num_layers": 1})
  straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
  trainer.train_and_evaluate(config, straight, data=presence_task)

  def kill_at_5(step):
    if step == 5:
      raise Killed()

  with pytest.raises(Killed):
    trainer.train_and_evaluate(config, resumed, step_hook=kill_at_5, data=presence_task)
  seen = []
  results = trainer.train_and_evaluate(config, resumed, step_hook=seen.append,
                                       data=presence_task)
  assert seen == [5, 6, 7], "the run must resume after step 4, saved as the first best"
  chex.assert_trees_all_equal(_final_params(resumed, config, presence_task),
                              _final_params(straight, config, presence_task))
  with open(os.path.join(straight, "results.json")) as f:
    assert json.load(f)["test_accuracy_best_val"] == results["test_accuracy_best_val"]
  with open(os.path.join(resumed, "metrics.jsonl")) as f:
    records = [(r["step"], r["split"]) for r in map(json.loads, f)]
  assert len(records) == len(set(records)), "a resumed run must not duplicate metric records"


def test_tiny_run_learns_and_eval_reproduces_test_accuracy(presence_task, tmp_path):
  config = tiny_config(num_train_steps=150, eval_frequency=50, checkpoint_every=50,
                       log_every=10, **{"data.bucket": 16})
  workdir = str(tmp_path / "run")
  results = trainer.train_and_evaluate(config, workdir, data=presence_task)
  assert results["test_majority_rate"] < 0.6
  assert results["test_accuracy_best_val"] > 0.9, results
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    train = [r for r in map(json.loads, f) if r["split"] == "train"]
  train_losses = [r["loss"] for r in train]
  assert train_losses[-1] < 0.5 * train_losses[0]
  # Each new bucket width compiled once; its time is counted in its window only.
  assert train[0]["new_shapes"] >= 1 and train[0]["compile_seconds"] > 0
  assert 1 <= sum(r["new_shapes"] for r in train) == results["train_shapes_compiled_in_loop"] <= 3
  assert sum(r["compile_seconds"] for r in train) == pytest.approx(
      results["train_compile_seconds_this_run"])
  for r in train:
    assert (r["compile_seconds"] > 0) == (r["new_shapes"] > 0)
    assert r["steps_per_sec_excluding_compile"] >= r["steps_per_sec"]
  assert os.path.isdir(os.path.join(workdir, "tb"))
  model, state = _state(config, presence_task)
  _, p_eval = steps.pmap_steps(model.apply)
  saved = checkpoints.checkpoint_manager(os.path.join(workdir, "checkpoints"), None)
  assert saved.best_step() == results["best_step"]
  state, meta, step = checkpoints.restore_checkpoint(saved, state, results["best_step"])
  test = evaluation.evaluate(p_eval, steps.replicate(state.params), presence_task.test,
                             batches.BatchConfig.from_config_dict(config))
  assert test["accuracy"] == results["test_accuracy_best_val"] and test["count"] == 200
  assert test["majority_rate"] == pytest.approx(presence_task.test.majority_rate())
  # A subset evaluation reports the majority rate of the examples it read.
  sub = evaluation.evaluate(p_eval, steps.replicate(state.params), presence_task.test,
                            batches.BatchConfig.from_config_dict(config), num_batches=2)
  k = int(sub["count"])
  assert 0 < k < 200
  read = presence_task.test.labels[np.random.default_rng(config.seed).permutation(200)[:k]]
  assert sub["majority_rate"] == pytest.approx(np.bincount(read).max() / k)


def test_precompile_finds_the_widths_the_run_meets(presence_task):
  config = batches.BatchConfig.from_config_dict(
      tiny_config(**{"data.bucket": 8, "data.group_by_length": True}))
  found = precompile.train_batches_by_width(presence_task.train, config, 3, 20)
  stream = batches.train_batches(presence_task.train, config, 3)
  met = {next(stream)["inputs"].shape[1] for _ in range(20)}
  assert sorted(found) == sorted(met) and len(met) >= 2
  for width, batch in found.items():
    chex.assert_shape(batch["inputs"], (16, width))   # this host's [rows, width]


def test_precompiled_steps_train_the_same_run_without_compiling_in_the_loop(presence_task,
                                                                             tmp_path,
                                                                             monkeypatch):
  config = tiny_config(num_train_steps=4, eval_frequency=4, checkpoint_every=4, warmup=2,
                       num_eval_steps=2, num_test_steps=2,
                       **{"data.bucket": 8, "data.group_by_length": True,
                          "model.num_layers": 1})
  plain = trainer.train_and_evaluate(config, str(tmp_path / "plain"), data=presence_task)
  direct_calls, pmap_steps = [], steps.pmap_steps

  class Counted:   # a pmapped step whose direct calls (which would compile) are counted
    def __init__(self, step, kind):
      self.step, self.kind = step, kind

    def __call__(self, *args):
      direct_calls.append(self.kind)
      return self.step(*args)

    def lower(self, *args):
      return self.step.lower(*args)

  monkeypatch.setattr(steps, "pmap_steps", lambda apply_fn: tuple(
      Counted(step, kind) for step, kind in zip(pmap_steps(apply_fn), ("train", "eval"))))
  pre = trainer.train_and_evaluate(config, str(tmp_path / "pre"), data=presence_task,
                                   precompile_workers=2)
  assert direct_calls == [], "every step must run a precompiled program"
  assert pre["train_shapes_compiled_in_loop"] == 0
  assert pre["precompiled_train_shapes"] == plain["train_shapes_compiled_in_loop"] >= 2
  assert pre["precompiled_eval_shapes"] >= 1
  for key in ("test_accuracy_best_val", "test_loss_best_val", "test_accuracy_final",
              "best_val_accuracy"):
    assert pre[key] == plain[key], key
  chex.assert_trees_all_equal(_final_params(str(tmp_path / "pre"), config, presence_task),
                              _final_params(str(tmp_path / "plain"), config, presence_task))
  with pytest.raises(ValueError, match="--precompile_workers"):
    trainer.train_and_evaluate(config, str(tmp_path / "bad"), data=presence_task,
                               precompile_workers=-1)


def test_runs_that_differ_only_outside_the_optimizer_share_one():
  """The train state's ``tx`` is part of its pytree structure, so a new optimizer object
  retraces the train step: runs of an equal model that differ in seed, batch size or length
  get the same object; any field the optimizer reads gives another."""
  def tx(**overrides):
    return train_state.make_optimizer(run_config.TrainConfig.from_config_dict(
        tiny_config(**overrides)))
  base = tx()
  assert tx(seed=3, batch_size=8, num_train_steps=7, max_train_minutes=2.0) is base
  for field, value in (("learning_rate", 0.01), ("warmup", 5), ("weight_decay", 0.25),
                       ("grad_clip_norm", 1.0), ("grad_accum_steps", 2)):
    assert tx(**{field: value}) is not base, field
  cosine = "constant * linear_warmup * cosine_decay"   # decays over num_train_steps
  assert tx(factors=cosine, num_train_steps=7) is not tx(factors=cosine, num_train_steps=8)


def test_batch_size_must_split_over_devices_and_micro_steps():
  config = tiny_config(batch_size=15)
  with pytest.raises(ValueError, match="batch_size=15 must be divisible"):
    run_config.RunConfig.from_config_dict(config, 2)


def test_in_flight_limit_waits_for_the_oldest_calls_only():
  class Leaf:
    def __init__(self, i):
      self.i = i

    def block_until_ready(self):
      waited.append(self.i)
      return self

  waited = []
  limit = steps.InFlightLimit(2)
  for i in range(6):
    limit.add({"sums": Leaf(i)})
    assert waited == list(range(max(0, i - 1))), "calls older than the last 2 are waited for"
  with pytest.raises(ValueError, match="limit=0 must be >= 1"):
    steps.InFlightLimit(0)


def test_evaluate_keeps_few_batches_in_flight(presence_task, monkeypatch):
  # Unbounded run-ahead deadlocks XLA's CPU client with 2 devices (InFlightLimit's docstring).
  added = []

  class Recording(steps.InFlightLimit):
    def add(self, outputs):
      super().add(outputs)
      added.append(outputs)
      older = added[:-self.limit]
      assert all(x.is_ready() for x in jax.tree_util.tree_leaves(older))

  monkeypatch.setattr(evaluation, "InFlightLimit", Recording)
  config = tiny_config()
  model, state = _state(config, presence_task)
  _, p_eval = steps.pmap_steps(model.apply)
  result = evaluation.evaluate(p_eval, steps.replicate(state.params), presence_task.test,
                               batches.BatchConfig.from_config_dict(config))
  assert result["count"] == 200
  assert len(added) == -(-200 // batches.eval_batch_size(
      batches.BatchConfig.from_config_dict(config))) > Recording().limit


class _RecordingParallel(steps.PmapParallel):
  """pmap's placement, recording the leaf counts of the trees read back to the host."""

  def __init__(self):
    super().__init__()
    self.read = []

  def host(self, tree):
    self.read.append(len(jax.tree_util.tree_leaves(tree)))
    return super().host(tree)


def test_the_finiteness_check_reads_no_parameters_back_and_still_stops_on_nan(presence_task):
  _, state = _state(tiny_config(), presence_task)
  parallel = _RecordingParallel()
  metrics = {"metrics": steps.metrics_of(jnp.zeros((2, 3)), jnp.zeros(2, jnp.int32),
                                          jnp.ones(2)), "grad_norm": jnp.ones(())}
  loop.check_finite([(3, metrics)], parallel.put_state(state), "checkpoints/2", parallel)
  assert parallel.read == [2]   # the step's loss sum and gradient norm, not the parameters
  bad = state.replace(params=jax.tree_util.tree_map(lambda p: p.at[(0,) * p.ndim].set(jnp.nan),
                                                    state.params))
  with pytest.raises(errors.NonFiniteError, match=r"step 3: .*params nan.*checkpoints/2"):
    loop.check_finite([(3, metrics)], parallel.put_state(bad), "checkpoints/2", parallel)


def majority_split():
  """21 examples of 3 classes (9, 8, 4); the shortest, of class 1, fills the last of three
  eval batches of 8 (5 real rows, 3 fillers): counting fillers would make class 1 the majority."""
  rng = np.random.default_rng(2)
  labels = rng.permutation([0] * 9 + [1] * 8 + [2] * 4)
  lengths = rng.integers(6, 30, 21)
  lengths[np.flatnonzero(labels == 1)[0]] = 3
  split = common.RaggedExamples.from_sequences(
      [rng.integers(1, 16, n) for n in lengths], labels)
  return tasks.TaskData(split, split, split, vocab_size=16, num_classes=3, source="synthetic")


@pytest.mark.parametrize("parallel", [steps.PmapParallel, steps.JitParallel])
def test_majority_rate_is_a_numpy_count_of_the_real_rows(parallel):
  task, config, parallel = majority_split(), tiny_config(eval_batch_size=8), parallel()
  model, state = _state(config, task)
  _, p_eval = parallel.steps(model.apply)
  params = parallel.put_state(state.params)
  batch_config = batches.BatchConfig.from_config_dict(config)
  read = list(batches.eval_batches(task.test, batch_config, 8))
  assert [int(b["weights"].sum()) for b in read] == [8, 8, 5]
  expected = np.bincount(task.test.labels).max() / 21            # 9 / 21
  with_fillers = np.concatenate([b["targets"] for b in read])
  assert np.bincount(with_fillers).max() / 24 != expected         # 11 / 24: the test can fail
  result = evaluation.evaluate(p_eval, params, task.test, batch_config, -1, parallel)
  assert result["majority_rate"] == expected and result["count"] == 21
  sub = evaluation.evaluate(p_eval, params, task.test, batch_config, 2, parallel)
  picked = task.test.labels[np.random.default_rng(config.seed).permutation(21)[:16]]
  assert sub["majority_rate"] == np.bincount(picked).max() / 16 and sub["count"] == 16


def test_majority_rate_metric_merges_and_refuses_unknown_labels():
  def rate(labels, weights, k=3):
    return steps.MajorityRate.from_model_output(labels=jnp.asarray(labels, jnp.int32),
                                                label_weights=jnp.asarray(weights, jnp.float32),
                                                num_classes=k)
  merged = rate([0, 2, 2, 1], [1, 1, 1, 0]).merge(rate([1, 1], [1, 1]))
  np.testing.assert_array_equal(merged.counts, [1, 2, 2])
  assert merged.compute() == 2 / 5 and steps.MajorityRate.empty().compute() == 0.0
  np.testing.assert_array_equal(
      steps.MajorityRate.empty().merge(merged).merge(steps.MajorityRate.empty()).counts, [1, 2, 2])
  assert rate([0, 1], [0, 0]).compute() == 0.0
  assert rate([5, 0], [0, 1]).compute() == 1.0    # a filler's label is never read
  with pytest.raises(ValueError, match=r"1 evaluated rows carry a label outside \[0, 3\)"):
    rate([0, 3], [1, 1]).compute()
