"""Ten kills in one lineage, each at a chosen moment, end with an uninterrupted run's numbers.

Issue 61's proof for one checkpoint manager keeping the newest and the best steps: the presence
task with :func:`tests.test_faults.fault_config` (10 steps, validation every 3, a checkpoint
every 2) is killed ten times in turn, and each start resumes from the newest step on disk.
A kill is a ``BaseException`` that no ``except Exception`` catches, raised:

* inside a synchronous save, after its files are written and before orbax renames the step
  into place (a regular checkpoint, and a save at a new best validation);
* inside an asynchronous save (``async_checkpoints``), while the background thread writes
  the arrays: the step never appears;
* right after a step, between checkpoints or just after one (the step hook);
* during the final tests, of the final and of the best-validation parameters.

The finished lineage must hold bit-identical parameters (the newest and the best step), the
same ``results.json`` figures and no ``(step, split)`` record twice in ``metrics.jsonl``.
"""

import json
import os

import chex
import orbax.checkpoint as ocp
import pytest

from simpletron_jax.train import final_test, loop, trainer
from simpletron_jax.run import run_guard
from tests.test_faults import (KilledBySignal, _kill_at, _kill_inside_save, _params,
                               fault_config)


def _kill_during_async_save(monkeypatch, kill_step):
  """Starts the save of ``kill_step`` in the background, then dies before the arrays are
  written: the background write fails as the dead process's would never finish."""
  handler = ocp.type_handlers.NumpyHandler
  real_background, real_save = handler._background_serialize, loop.save_checkpoint
  dying = {"now": False}

  async def background(self, values, infos, args=None):
    if dying["now"]:
      raise OSError("the process was killed before the arrays were written")
    return await real_background(self, values, infos, args)

  def save(manager, step, *args, **kwargs):
    dying["now"] = step == kill_step
    real_save(manager, step, *args, **kwargs)
    if step == kill_step:
      raise KilledBySignal()

  monkeypatch.setattr(handler, "_background_serialize", background)
  monkeypatch.setattr(loop, "save_checkpoint", save)


def _kill_in_final_test(monkeypatch, split):
  """Dies when the final test of ``split`` (``test_final`` or ``test``) starts."""
  real = final_test.recorded_test

  def recorded_test(earlier, logger, step, which, compute):
    if which == split:
      raise KilledBySignal()
    return real(earlier, logger, step, which, compute)

  monkeypatch.setattr(final_test, "recorded_test", recorded_test)


# (what kills the start, its step or split, async_checkpoints for that start)
KILLS = [("inside_save", 2, False),       # the first regular checkpoint
         ("after_step", 3, False),        # right after the first best save
         ("inside_save", 4, False),       # a regular checkpoint after a best one
         ("after_step", 5, False),        # between checkpoints
         ("async_save", 6, True),         # a checkpoint and a best save, written in the background
         ("after_step", 6, True),         # right after that save, written this time
         ("inside_save", 8, False),
         ("after_step", 9, False),        # after the last validation before the end
         ("final_test", "test_final", False),
         ("final_test", "test", False)]


@pytest.mark.slow
def test_ten_kills_resume_to_the_uninterrupted_run(presence_task, tmp_path, monkeypatch):
  straight = str(tmp_path / "straight")
  expected = trainer.train_and_evaluate(fault_config(), straight, data=presence_task)
  workdir = str(tmp_path / "killed")
  for how, where, async_save in KILLS:
    with monkeypatch.context() as m:
      hook = None
      if how == "inside_save":
        _kill_inside_save(m, where)
      elif how == "async_save":
        _kill_during_async_save(m, where)
      elif how == "final_test":
        _kill_in_final_test(m, where)
      else:
        hook = _kill_at(where)
      with pytest.raises(BaseException) as killed:
        trainer.train_and_evaluate(fault_config(async_checkpoints=async_save), workdir,
                                   data=presence_task, step_hook=hook)
      assert type(killed.value).__name__ in ("Killed", "KilledBySignal"), (how, where)
  results = trainer.train_and_evaluate(fault_config(), workdir, data=presence_task)
  config = fault_config()
  for which in ("latest", "best"):
    ours, theirs = (_params(w, config, presence_task, which) for w in (workdir, straight))
    chex.assert_trees_all_equal(ours, theirs)
    assert run_guard.state_crc32(ours) == run_guard.state_crc32(theirs), which
  for key in ("best_step", "best_val_accuracy", "test_accuracy_best_val", "test_loss_best_val",
              "test_accuracy_final", "test_loss_final", "val_majority_rate",
              "test_majority_rate", "final_step", "complete", "config_fingerprint"):
    assert results[key] == expected[key], key
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [(r["step"], r["split"]) for r in map(json.loads, f)]
  assert len(records) == len(set(records))
  assert (10, "test_final") in records and (expected["best_step"], "test") in records
