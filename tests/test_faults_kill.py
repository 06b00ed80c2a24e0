"""Issue 48, deliverable 6: SIGKILL at random moments, then resume, ends as a run never killed.

One lineage is killed three times with a real ``SIGKILL`` (no handler, no clean-up), each time
in a child process, then finished here:

1. at a random moment from outside (the parent kills the child a random delay after its first
   train record; steps are slowed a little so that the kill lands inside the run);
2. inside the next checkpoint save after the resume point, at one of orbax's three renames
   (the ``meta`` item, the ``state`` item, or the step folder itself), i.e. after its files
   are written and before the step is in place;
3. right after a random step between checkpoints (its work since the last checkpoint is lost).

The finished lineage must hold bit-identical parameters (the newest and the best) and
the same ``results.json`` figures as an uninterrupted run, and ``metrics.jsonl`` the same
records: compared by ``(step, split)``, none twice, every value but the timings equal. The
one allowed difference (docs/faults.md) is a train record whose window a resume cut short: the
first one after a resume from a step that is not a multiple of ``log_every`` averages fewer
steps. The moments are drawn from a seeded ``random.Random`` and printed on failure.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time

import chex
import pytest

from simpletron_jax.train import trainer
from simpletron_jax.run import run_folder, run_guard
from simpletron_jax.run.metric_logging import read_records
from tests.conftest import ROOT
from tests.test_faults import _params, fault_config

# The child: the presence task and fault_config() of tests/test_faults.py, killed as told.
_WORKER = """
import os, signal, sys, time
sys.path.insert(0, {root!r})
from tests import multihost_worker as worker
from tests.test_faults import fault_config
from simpletron_jax.train import trainer

mode, arg, workdir = sys.argv[1:4]


def kill():
  os.kill(os.getpid(), signal.SIGKILL)


hook = None
if mode == "in_save":   # at the n-th rename of checkpoint K's save
  step, nth = (int(x) for x in arg.split(":"))
  real_rename, seen = os.rename, []

  def rename(src, dst, *args, **kwargs):
    if f"{{os.sep}}checkpoints{{os.sep}}{{step}}.orbax-checkpoint-tmp" in os.fspath(src):
      seen.append(os.fspath(dst))
      if len(seen) == nth + 1:
        kill()
    return real_rename(src, dst, *args, **kwargs)

  os.rename = rename
elif mode == "after_step":
  hook = lambda step: step == int(arg) and kill()
elif mode == "slow":   # the parent kills it; each step takes `arg` seconds longer
  hook = lambda step: time.sleep(float(arg))
trainer.train_and_evaluate(fault_config(), workdir, data=worker.presence_data(),
                           step_hook=hook)
print("finished")
"""

TIMINGS = ("time", "steps_per_sec", "steps_per_sec_excluding_compile", "compile_seconds",
           "new_shapes")


def _child(mode, arg, workdir):
  return subprocess.Popen([sys.executable, "-c", _WORKER.format(root=ROOT), mode, str(arg),
                           workdir], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def _checkpoint_steps(workdir):
  folder = os.path.join(workdir, "checkpoints")
  return sorted(int(n) for n in os.listdir(folder) if n.isdigit()) if os.path.isdir(folder) \
      else []


def _records(workdir):
  """``{(step, split): record without timings}`` of ``metrics.jsonl`` (``info`` left out),
  and the number of such records (to find one written twice)."""
  records = [r for r in read_records(os.path.join(workdir, "metrics.jsonl"))
             if r["split"] != "info"]
  return ({(r["step"], r["split"]): {k: v for k, v in r.items() if k not in TIMINGS}
           for r in records}, len(records))


def _starts(workdir):
  """The steps each start of the run resumed from (the ``info`` record every start writes)."""
  return sorted({r["step"] for r in read_records(os.path.join(workdir, "metrics.jsonl"))
                 if r["split"] == "info"})


def assert_same_records(killed, straight, log_every):
  """The records of a killed-and-resumed run equal an uninterrupted run's, by (step, split);
  a train record whose window a resume from a step off the ``log_every`` grid cut short may
  differ in its averages (loss, accuracy), nothing else."""
  ours, count = _records(killed)
  theirs, _ = _records(straight)
  assert count == len(ours), "a (step, split) record was written twice"
  assert sorted(ours) == sorted(theirs)
  cut_short = {step for step, split in theirs if split == "train"
               for start in _starts(killed) if step - log_every < start < step}
  for key, record in theirs.items():
    if key[1] == "train" and key[0] in cut_short:
      record = {k: v for k, v in record.items() if k not in ("loss", "accuracy")}
      assert {k: v for k, v in ours[key].items() if k in record} == record, key
    else:
      assert ours[key] == record, key


@pytest.fixture(scope="module")
def straight(presence_task, tmp_path_factory):
  """An uninterrupted :func:`fault_config` run: (workdir, results)."""
  workdir = str(tmp_path_factory.mktemp("straight") / "run")
  return workdir, trainer.train_and_evaluate(fault_config(), workdir, data=presence_task)


@pytest.mark.slow
def test_sigkill_at_random_moments_resumes_bit_identical(straight, presence_task, tmp_path):
  config, workdir = fault_config(), str(tmp_path / "killed")
  rng = random.Random(48)
  story = []   # what happened, for the failure message

  # 1. From outside, a random delay after the first train record.
  delay = rng.uniform(0.0, 0.35)
  proc = _child("slow", 0.2, workdir)
  metrics, started = os.path.join(workdir, "metrics.jsonl"), time.time()
  while not (os.path.exists(metrics) and '"split": "train"' in open(metrics).read()):
    assert proc.poll() is None and time.time() - started < 300, proc.communicate()[0][-3000:]
    time.sleep(0.02)
  time.sleep(delay)
  proc.send_signal(signal.SIGKILL)
  output = proc.communicate(timeout=60)[0]
  story.append(f"killed from outside {delay:.2f} s after the first train record, "
               f"checkpoints {_checkpoint_steps(workdir)}")
  assert proc.returncode == -signal.SIGKILL, (story, output[-3000:])

  # 2. Inside the next checkpoint save, at one of its renames.
  resume = max(_checkpoint_steps(workdir), default=0)
  save_step, nth = resume + config.checkpoint_every, rng.randrange(3)
  assert save_step < config.num_train_steps, story
  proc = _child("in_save", f"{save_step}:{nth}", workdir)
  output = proc.communicate(timeout=300)[0]
  left = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
  story.append(f"killed at rename {nth} of the save of step {save_step}: {left}")
  assert proc.returncode == -signal.SIGKILL, (story, output[-3000:])
  assert str(save_step) not in left and any(n.startswith(f"{save_step}.orbax-checkpoint-tmp")
                                            for n in left), story

  # 3. Right after a random step between checkpoints.
  resume = max(_checkpoint_steps(workdir), default=0)
  step = rng.choice([s for s in range(resume + 1, config.num_train_steps)
                     if s % config.checkpoint_every])
  proc = _child("after_step", step, workdir)
  output = proc.communicate(timeout=300)[0]
  story.append(f"killed after step {step}, checkpoints {_checkpoint_steps(workdir)}")
  assert proc.returncode == -signal.SIGKILL, (story, output[-3000:])
  assert not os.path.exists(os.path.join(workdir, "results.json")), story

  results = trainer.train_and_evaluate(config, workdir, data=presence_task)
  straight_dir, straight_results = straight
  for which in ("latest", "best"):
    ours, theirs = (_params(w, config, presence_task, which) for w in (workdir, straight_dir))
    chex.assert_trees_all_equal(ours, theirs)
    assert run_guard.state_crc32(ours) == run_guard.state_crc32(theirs), (which, story)
  for key in ("best_step", "best_val_accuracy", "test_accuracy_best_val", "test_loss_best_val",
              "test_accuracy_final", "test_loss_final", "val_majority_rate",
              "test_majority_rate", "final_step", "complete", "config_fingerprint"):
    assert results[key] == straight_results[key], (key, story)
  with open(os.path.join(workdir, "results.json")) as f:
    assert json.load(f) == results
  assert_same_records(workdir, straight_dir, config.log_every)
  assert not os.path.exists(os.path.join(workdir, run_folder.LOCK_FILE))
  print("; ".join(story))   # shown with -s, and on failure


def test_the_record_comparison_allows_only_a_window_cut_short(tmp_path):
  """:func:`assert_same_records` itself: a train record after a resume off the grid may
  average fewer steps; any other difference, or a record written twice, fails."""
  def write(folder, records):
    os.makedirs(folder)
    with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in records)

  base = [{"step": 0, "split": "info", "params": 1.0},
          {"step": 2, "split": "train", "loss": 1.0, "accuracy": 0.5, "learning_rate": 0.1},
          {"step": 4, "split": "train", "loss": 0.8, "accuracy": 0.6, "learning_rate": 0.1},
          {"step": 4, "split": "val", "loss": 0.9, "accuracy": 0.55}]
  write(tmp_path / "straight", base)
  resumed = base[:2] + [{"step": 3, "split": "info", "params": 1.0},
                        {**base[2], "loss": 0.7, "accuracy": 0.7}, base[3]]
  write(tmp_path / "resumed", resumed)
  assert_same_records(str(tmp_path / "resumed"), str(tmp_path / "straight"), log_every=2)
  write(tmp_path / "other_val", base[:3] + [{**base[3], "accuracy": 0.56}])
  with pytest.raises(AssertionError):
    assert_same_records(str(tmp_path / "other_val"), str(tmp_path / "straight"), 2)
  write(tmp_path / "twice", base + [base[3]])
  with pytest.raises(AssertionError, match="written twice"):
    assert_same_records(str(tmp_path / "twice"), str(tmp_path / "straight"), 2)
  write(tmp_path / "not_cut", base[:2] + [{**base[2], "loss": 0.7}, base[3]])
  with pytest.raises(AssertionError):   # no resume at step 3: the window was whole
    assert_same_records(str(tmp_path / "not_cut"), str(tmp_path / "straight"), 2)
