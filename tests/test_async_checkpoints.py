"""Asynchronous checkpoint saves (issue 29, ``config.async_checkpoints``).

With ``async_save=True`` orbax writes each checkpoint in a background thread. These tests
hold that thread at chosen points (the write of the arrays, the finalisation that renames
the step's temporary folder into place) to check the guarantees of
:mod:`simpletron_jax.train.checkpoints`:

* the arrays, CRC-32 and layout stored are those of the state handed to ``save_checkpoint``,
  even when the caller changes its arrays before the write (a private host copy);
* a step whose write has not finished is never listed by a manager that reads the folder
  (a resumed run, another process): it sits in ``<step>.orbax-checkpoint-tmp`` until
  orbax renames it, which is also all a process killed mid-save leaves behind;
* a background write that fails is a ``CheckpointError`` naming its step folder, raised by
  the next save or by ``finish_saves``; a full disk (a small tmpfs) is reported the same
  way;
* a training run saves the same steps, bit for bit, as a synchronous one, and every
  checkpoint is on disk when ``step_hook`` runs and when the run returns;
* several processes are refused, naming ``config.async_checkpoints``.
"""

import asyncio
import os
import threading

import chex
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from simpletron_jax.runtime import errors
from simpletron_jax.train import checkpoints, trainer
from simpletron_jax.run import run_guard
from tests.test_faults import fault_config
from tests.test_faults_lifecycle import SmallDisk, deadline
from tests.test_train import _state

GATE_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def initial_state(presence_task):
  """(config, TrainState at step 0 with writable numpy leaves) of :func:`fault_config`."""
  config = fault_config()
  state = _state(config, presence_task)[1]
  host = jax.tree_util.tree_map(np.array, jax.device_get((state.params, state.opt_state)))
  return config, state.replace(params=host[0], opt_state=host[1])


def _meta(config):
  return {"run_id": "r", "model_config": checkpoints.model_config_dict(config.model)}


def _host(tree):
  return jax.tree_util.tree_map(lambda x: np.array(x, copy=True), jax.device_get(tree))


class _Gate:
  """Holds orbax's background thread inside a patched method until :meth:`open`."""

  def __init__(self):
    self.reached, self.released = threading.Event(), threading.Event()

  def hold(self):
    self.reached.set()
    assert self.released.wait(GATE_TIMEOUT_S), "the test never opened the gate"

  def wait_reached(self):
    assert self.reached.wait(GATE_TIMEOUT_S), "the background save never got there"

  def open(self):
    self.released.set()


def _hold_array_writes(monkeypatch, gate):
  """Makes orbax's numpy writes wait for ``gate``, and stops orbax's own deep copy of the
  arrays, so only :mod:`checkpoints`' private copy keeps them from the caller."""
  handler = ocp.type_handlers.NumpyHandler
  real_serialize, real_background = handler.serialize, handler._background_serialize

  async def serialize(self, values, infos, args=None):
    self._deepcopy_host_arrays = False
    return await real_serialize(self, values, infos, args)

  async def background(self, values, infos, args=None):
    await asyncio.to_thread(gate.hold)
    return await real_background(self, values, infos, args)

  monkeypatch.setattr(handler, "serialize", serialize)
  monkeypatch.setattr(handler, "_background_serialize", background)


def _patch_finalize(monkeypatch, step_dir_name, action):
  """Runs ``action()`` in orbax's background thread before it finalises ``step_dir_name``'s
  temporary folder (the rename that makes the step visible)."""
  real = ocp.CompositeCheckpointHandler.finalize

  def finalize(self, directory):
    if os.path.basename(str(directory)).startswith(step_dir_name + "."):
      action()
    return real(self, directory)

  monkeypatch.setattr(ocp.CompositeCheckpointHandler, "finalize", finalize)


def test_async_round_trip_stores_the_state_handed_in(initial_state, tmp_path, monkeypatch):
  config, state = initial_state
  manager = checkpoints.checkpoint_manager(str(tmp_path / "ckpt"), None, async_save=True)
  mine = state.replace(step=2, params=_host(state.params), opt_state=_host(state.opt_state))
  expected = _host((mine.params, mine.opt_state))
  gate = _Gate()
  _hold_array_writes(monkeypatch, gate)
  with deadline(120):
    checkpoints.save_checkpoint(manager, 2, mine, _meta(config))
    gate.wait_reached()   # save_checkpoint returned; the arrays are not written yet
    for leaf in jax.tree_util.tree_leaves((mine.params, mine.opt_state)):
      leaf[...] = leaf + 1   # the caller reuses its arrays
    gate.open()
    checkpoints.finish_saves(manager)
  monkeypatch.undo()
  fresh = checkpoints.checkpoint_manager(str(tmp_path / "ckpt"), None)
  restored, meta, step = checkpoints.restore_checkpoint(fresh, state, model_config=config.model)
  assert step == 2 and int(restored.step) == 2
  chex.assert_trees_all_equal((restored.params, restored.opt_state), expected)
  assert meta["state_crc32"] == run_guard.state_crc32(expected)
  assert meta["state_structure"] == run_guard.state_structure(expected)


def test_a_step_being_written_is_invisible_until_renamed(initial_state, tmp_path, monkeypatch):
  config, state = initial_state
  folder = str(tmp_path / "ckpt")
  manager = checkpoints.checkpoint_manager(folder, None, async_save=True)
  checkpoints.save_checkpoint(manager, 2, state.replace(step=2), _meta(config))
  newer = state.replace(step=4, params=jax.tree_util.tree_map(lambda p: p * 0.5, state.params))
  gate = _Gate()
  _patch_finalize(monkeypatch, "4", gate.hold)
  with deadline(120):
    checkpoints.save_checkpoint(manager, 4, newer, _meta(config))
    gate.wait_reached()   # step 4's files are written, its folder not yet renamed
    names = sorted(os.listdir(folder))
    assert "4" not in names and any(n.startswith("4.orbax-checkpoint-tmp") for n in names), names
    reader = checkpoints.checkpoint_manager(folder, None)   # a resumed run, another process
    assert reader.all_steps() == [2]
    _, _, step = checkpoints.restore_checkpoint(reader, state, model_config=config.model)
    assert step == 2
    gate.open()
    checkpoints.finish_saves(manager)
  assert sorted(os.listdir(folder)) == ["2", "4"]
  reader = checkpoints.checkpoint_manager(folder, None)
  restored, _, step = checkpoints.restore_checkpoint(reader, state, model_config=config.model)
  assert step == 4
  chex.assert_trees_all_equal(restored.params, newer.params)


def test_a_failed_background_save_is_reported_naming_its_step(initial_state, tmp_path,
                                                               monkeypatch):
  config, state = initial_state
  folder = str(tmp_path / "ckpt")
  manager = checkpoints.checkpoint_manager(folder, None, async_save=True)
  checkpoints.save_checkpoint(manager, 2, state.replace(step=2), _meta(config))

  def disk_full():
    raise OSError(28, "No space left on device")

  _patch_finalize(monkeypatch, "4", disk_full)
  with deadline(120):
    checkpoints.save_checkpoint(manager, 4, state.replace(step=4), _meta(config))  # returns
    with pytest.raises(errors.CheckpointError,
                       match=r"background save of step 4 to .*ckpt/4 failed: No space left on "
                             r"device \(OSError\)\. The checkpoints saved before it are kept\.$"):
      checkpoints.save_checkpoint(manager, 6, state.replace(step=6), _meta(config))
  assert manager.all_steps() == [2]
  assert checkpoints.checkpoint_manager(folder, None).all_steps() == [2]
  with deadline(120):   # at the end of a run: finish_saves reports it
    checkpoints.save_checkpoint(manager, 8, state.replace(step=8), _meta(config))
    checkpoints.finish_saves(manager)
    _patch_finalize(monkeypatch, "10", disk_full)
    checkpoints.save_checkpoint(manager, 10, state.replace(step=10), _meta(config))
    with pytest.raises(errors.CheckpointError, match=r"step 10 to .*ckpt/10 failed"):
      checkpoints.finish_saves(manager)
  assert checkpoints.checkpoint_manager(folder, None).all_steps() == [2, 8]


# tensorstore's callback for the failed write may come after orbax closed its event loop.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_full_disk_during_an_async_save_is_a_checkpoint_error(initial_state, tmp_path,
                                                                monkeypatch):
  config, state = initial_state
  disk = SmallDisk(tmp_path / "disk", monkeypatch, size_mib=2)
  try:
    folder = os.path.join(disk.path, "ckpt")
    manager = checkpoints.checkpoint_manager(folder, None, async_save=True)
    checkpoints.save_checkpoint(manager, 2, state.replace(step=2), _meta(config))
    checkpoints.finish_saves(manager)
    disk.fill()
    with deadline(120), pytest.raises(errors.CheckpointError, match=r"ckpt/4\b") as error:
      checkpoints.save_checkpoint(manager, 4, state.replace(step=4), _meta(config))
      checkpoints.finish_saves(manager)   # the write may fail in the background
    print(f"{disk.mode}: {error.value}")
    disk.free()
    monkeypatch.undo()
    reader = checkpoints.checkpoint_manager(folder, None)
    assert reader.all_steps() == [2]
    _, _, step = checkpoints.restore_checkpoint(reader, state, model_config=config.model)
    assert step == 2
  finally:
    disk.unmount()


def test_several_processes_are_refused_naming_the_field(tmp_path, monkeypatch):
  checkpoints.check_async_supported(False, 2)   # synchronous saves: any process count
  checkpoints.check_async_supported(True, 1)
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  with pytest.raises(ValueError, match=r"config\.async_checkpoints=True .*has 2\)"):
    checkpoints.checkpoint_manager(str(tmp_path / "ckpt"), None, async_save=True)
  assert not (tmp_path / "ckpt").exists()


def _run(presence_task, workdir, async_checkpoints, monkeypatch):
  """A :func:`fault_config` run; returns (config, results, {step: steps on disk at
  step_hook})."""
  config = fault_config()
  config.async_checkpoints = async_checkpoints
  on_disk, made = {}, []
  real_manager = checkpoints.checkpoint_manager

  def manager(directory, max_to_keep, async_save=False):
    made.append(async_save)
    return real_manager(directory, max_to_keep, async_save=async_save)

  monkeypatch.setattr(checkpoints, "checkpoint_manager", manager)

  def hook(step):
    on_disk[step] = real_manager(os.path.join(workdir, "checkpoints"), None).all_steps()

  results = trainer.train_and_evaluate(config, workdir, data=presence_task, step_hook=hook)
  assert made == [async_checkpoints], made
  return config, results, on_disk


@pytest.mark.slow
def test_an_async_run_saves_what_a_sync_run_saves(presence_task, tmp_path, monkeypatch):
  runs = {}
  for flag in (False, True):
    workdir = str(tmp_path / f"async_{flag}")
    with monkeypatch.context() as m:
      config, results, on_disk = _run(presence_task, workdir, flag, m)
    saved = checkpoints.checkpoint_manager(os.path.join(workdir, "checkpoints"), None)
    _, state = _state(config, presence_task)
    restored = [checkpoints.restore_checkpoint(saved, state, step=s)[0]
                for s in saved.all_steps()]
    runs[flag] = results, on_disk, (saved.all_steps(), saved.best_step()), restored
  (sync_results, sync_disk, sync_steps, sync_states), (results, on_disk, steps, states) = (
      runs[False], runs[True])
  assert steps == sync_steps and steps[0][-1] == 10, steps
  assert on_disk == sync_disk   # each step's checkpoints were on disk when the hook ran
  assert len(states) == len(sync_states)
  for mine, theirs in zip(states, sync_states):
    chex.assert_trees_all_equal((mine.step, mine.params, mine.opt_state),
                                (theirs.step, theirs.params, theirs.opt_state))
  for key in ("test_accuracy_best_val", "test_loss_best_val", "test_accuracy_final", "best_step",
              "final_step"):
    assert results[key] == sync_results[key], key
