"""config.parallelism="jit": the pmapped steps' function under jax.jit over a device Mesh.

The jit steps must compute what the pmap steps compute (same parameters, metrics and
evaluations, dropout on), a run must resume from the other parallelism's checkpoints, and
the precompiled path must serve the jit steps too. Two processes: tests/test_multihost.py.
"""

import chex
import jax
import numpy as np
import pytest

from simpletron_jax.data.common import make_batch
from simpletron_jax.train import checkpoints, run_config, steps, train_state, trainer
from tests.test_train import tiny_config


def _run_steps(name, config, task, num_steps=3):
  """Params, last train metrics and an eval of ``num_steps`` train steps under ``name``."""
  parallel = steps.make_parallel(name)
  run = run_config.RunConfig.from_config_dict(config)
  model = train_state.build_model(run, task)
  state = train_state.create_train_state(run.train, model, jax.random.PRNGKey(0),
                                         config.model.max_length)
  train, evaluate = parallel.steps(model.apply)
  state = parallel.put_state(state)
  for i in range(num_steps):
    batch = make_batch(task.train, np.arange(16 * i, 16 * i + 16), max_length=40, bucket=8)
    state, metrics = train(state, parallel.put_batch(batch), jax.random.PRNGKey(i))
  sums = evaluate(state.params, parallel.put_batch(batch))
  return parallel.host((state.params, metrics, sums))


def test_jit_steps_compute_the_pmap_steps_function(presence_task):
  assert jax.local_device_count() == 2, "conftest must force 2 CPU devices"
  config = tiny_config(**{"model.dropout_rate": 0.1})   # per-device dropout keys must agree
  pmap_out, jit_out = (_run_steps(name, config, presence_task) for name in ("pmap", "jit"))
  chex.assert_trees_all_close(pmap_out, jit_out, rtol=1e-6, atol=1e-7)
  params, metrics, sums = jit_out
  assert steps.means(metrics["metrics"])["count"] == 16 and steps.means(sums)["count"] == 16
  chex.assert_shape(jax.tree_util.tree_leaves(params)[0],
                    jax.tree_util.tree_leaves(pmap_out[0])[0].shape)


def test_jit_places_global_arrays_on_a_mesh():
  parallel = steps.make_parallel("jit")
  batch = {"inputs": np.zeros((8, 16), np.int32)}
  placed = parallel.put_batch(batch)["inputs"]
  chex.assert_shape(placed, (8, 16))   # global [B, L], not pmap's [devices, B / devices, L]
  assert placed.sharding.spec == jax.sharding.PartitionSpec(steps.AXIS)
  assert [s.data.shape for s in placed.addressable_shards] == [(4, 16), (4, 16)]
  state = parallel.put_state({"w": np.ones((3,), np.float32)})
  assert state["w"].sharding.is_fully_replicated
  abstract = parallel.abstract_batch(batch)["inputs"]
  assert abstract.shape == (8, 16) and abstract.sharding == placed.sharding


def test_unknown_parallelism_is_named():
  with pytest.raises(ValueError, match="config.parallelism='vmap'"):
    steps.make_parallel("vmap")
  with pytest.raises(ValueError, match="parallelism='vmap'"):
    run_config.RunConfig.from_config_dict(tiny_config(parallelism="vmap"), 2)


def _final_params(workdir, config, task):
  run = run_config.RunConfig.from_config_dict(config)
  state = train_state.create_train_state(run.train, train_state.build_model(run, task),
                                         jax.random.PRNGKey(0), config.model.max_length)
  manager = checkpoints.checkpoint_manager(f"{workdir}/checkpoints", None)
  return checkpoints.restore_checkpoint(manager, state)[0].params


@pytest.mark.slow
def test_a_pmap_run_resumed_under_jit_ends_where_a_straight_pmap_run_does(presence_task,
                                                                         tmp_path):
  settings = {"num_train_steps": 6, "checkpoint_every": 3, "eval_frequency": 3, "warmup": 2,
              "num_eval_steps": 2, "num_test_steps": 2, "grad_accum_steps": 2}
  config = tiny_config(**settings)
  straight = trainer.train_and_evaluate(config, str(tmp_path / "pmap"), data=presence_task)

  def kill_at_3(step):
    if step == 3:
      raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    trainer.train_and_evaluate(config, str(tmp_path / "mixed"), data=presence_task,
                               step_hook=kill_at_3)
  jit_config = tiny_config(parallelism="jit", **settings)
  resumed = trainer.train_and_evaluate(jit_config, str(tmp_path / "mixed"),
                                       data=presence_task, precompile_workers=2)
  chex.assert_trees_all_close(_final_params(tmp_path / "mixed", config, presence_task),
                              _final_params(tmp_path / "pmap", config, presence_task),
                              rtol=1e-6, atol=1e-7)
  for key in ("test_accuracy_best_val", "test_accuracy_final", "best_val_accuracy", "best_step"):
    assert resumed[key] == pytest.approx(straight[key], rel=1e-6), key
  assert resumed["train_shapes_compiled_in_loop"] == 0, "the jit steps were precompiled"
