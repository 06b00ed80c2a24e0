"""Fault injection (issue 14): every fault ends either with the parameters of an
uninterrupted run or with an error that names its cause; none is silent.

Most cases run ``train_and_evaluate`` in-process on the presence task with a 1-layer model;
a kill is an exception raised from ``step_hook`` or from inside a checkpoint save. The
subprocess cases are marked ``slow``.
"""

import dataclasses
import gzip
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from absl import flags
from ml_collections import config_flags

from simpletron_jax.data import batches, image, listops, retrieval, text
from simpletron_jax.data.common import RaggedExamples
from simpletron_jax.model import attention, encoders
from simpletron_jax.runtime import atomic_io, cli, errors
from simpletron_jax.train import checkpoints, evaluation, run_config, steps, trainer
from simpletron_jax.run import run_folder, run_guard
from simpletron_jax.run.metric_logging import MetricLogger, read_records
from tests.conftest import ROOT, SMALL_LISTOPS, InterruptedWhileCollected
from tests.test_train import Killed, _state, tiny_config


def fault_config(**overrides):
  """A 1-layer model on 24 tokens: 10 steps, validation every 3, checkpoints every 2."""
  base = {"num_train_steps": 10, "checkpoint_every": 2, "eval_frequency": 3, "warmup": 5,
          "data.bucket": 0, "model.max_length": 24, "model.num_layers": 1}
  return tiny_config(**{**base, **overrides})


def _params(workdir, config, task, which="latest", step=None):
  _, state = _state(config, task)
  manager = checkpoints.checkpoint_manager(os.path.join(workdir, "checkpoints"), None)
  if step is None:
    step = checkpoints.pick_step(manager, which, workdir)
  return checkpoints.restore_checkpoint(manager, state, step)[0].params


def _strict_json_lines(path):
  """Parses every line with NaN/Infinity literals forbidden."""
  def refuse(token):
    raise AssertionError(f"{path}: non-standard JSON literal {token}")
  with open(path) as f:
    return [json.loads(line, parse_constant=refuse) for line in f if line.strip()]


# ----------------------------------------------------------------------------
# Kills and resume.


def _kill_at(step_to_kill):
  def hook(step):
    if step == step_to_kill:
      raise Killed()
  return hook


class KilledBySignal(BaseException):
  """A kill no ``except Exception`` can catch, like SIGKILL."""


def _kill_inside_save(monkeypatch, kill_step):
  """Makes the save of ``kill_step`` die after writing its files but before orbax finalises
  them, leaving what a killed process leaves: a temporary folder."""
  real_save = ocp.CheckpointManager.save

  def dying_save(self, step, *args, **kwargs):
    if step != kill_step:
      return real_save(self, step, *args, **kwargs)
    real_save(self, step, *args, **kwargs)
    final = os.path.join(str(self.directory), str(step))
    os.rename(final, final + ".orbax-checkpoint-tmp-1")
    raise KilledBySignal()

  monkeypatch.setattr(ocp.CheckpointManager, "save", dying_save)


# ----------------------------------------------------------------------------
# Damaged checkpoints.


@pytest.fixture(scope="module")
def initial_state(presence_task):
  """(config, TrainState at step 0) of :func:`fault_config`, built once for the module."""
  config = fault_config()
  return config, _state(config, presence_task)[1]


def _saved_steps(tmp_path, initial_state, steps=(2, 4)):
  config, state = initial_state
  manager = checkpoints.checkpoint_manager(str(tmp_path / "checkpoints"), None)
  meta = {"run_id": "r", "model_config": checkpoints.model_config_dict(config.model)}
  for step in steps:
    checkpoints.save_checkpoint(manager, step, state.replace(step=step), meta)
  return config, state, manager


def _truncate_largest(folder):
  files = [os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs]
  path = max(files, key=os.path.getsize)
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


def _flip_bytes(folder):
  """Flips bytes in the middle of the largest array file (an optimizer or param array)."""
  files = [os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs]
  path = max(files, key=os.path.getsize)
  with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    chunk = bytearray(f.read(16))
    f.seek(os.path.getsize(path) // 2)
    f.write(bytes(b ^ 0x5A for b in chunk))


def _truncate_meta(folder):
  with open(os.path.join(folder, "meta", "metadata"), "w") as f:
    f.write('{"run_id": "r", "model_con')


@pytest.mark.parametrize("damage", [_truncate_largest, _flip_bytes, _truncate_meta])
def test_damaged_newest_checkpoint_falls_back_to_the_previous(initial_state, tmp_path, damage):
  config, state, manager = _saved_steps(tmp_path, initial_state)
  damage(str(tmp_path / "checkpoints" / "4"))
  with pytest.warns(errors.RunWarning, match=r"skipping damaged checkpoint .*checkpoints/4"):
    restored, _, step = checkpoints.restore_checkpoint(
        manager, state, model_config=config.model, quarantine_dir=str(tmp_path / "damaged"))
  assert step == 2 and int(restored.step) == 2
  assert manager.all_steps() == [2] and os.listdir(tmp_path / "damaged")
  chex.assert_trees_all_equal(restored.params, state.params)


def test_every_checkpoint_damaged_is_an_error_naming_each(initial_state, tmp_path):
  config, state, manager = _saved_steps(tmp_path, initial_state)
  for step in (2, 4):
    _truncate_meta(str(tmp_path / "checkpoints" / str(step)))
  with pytest.warns(errors.RunWarning), pytest.raises(
      errors.CheckpointError, match=r"no intact checkpoint.*checkpoints/4.*checkpoints/2"):
    checkpoints.restore_checkpoint(manager, state, model_config=config.model)


def test_non_finite_state_is_neither_saved_nor_restored(initial_state, tmp_path):
  config, state, manager = _saved_steps(tmp_path, initial_state, steps=(2,))
  bad = state.replace(params=jax.tree_util.tree_map(lambda p: p * np.nan, state.params))
  with pytest.raises(errors.NonFiniteError, match=r"checkpoints/4"):
    checkpoints.save_checkpoint(manager, 4, bad, {})
  assert manager.all_steps() == [2]


def test_resume_with_another_model_config_lists_the_fields(initial_state, tmp_path):
  config, state, manager = _saved_steps(tmp_path, initial_state)
  other = fault_config(**{"model.mlp_dim": 48, "model.dropout_rate": 0.0})
  with pytest.raises(errors.ConfigMismatchError,
                     match=r"model.dropout_rate: checkpoint 0.1, config 0.0; "
                           r"model.mlp_dim: checkpoint 32, config 48"):
    checkpoints.restore_checkpoint(manager, state, model_config=other.model)


def test_a_checkpoint_from_before_an_option_existed_is_refused_in_one_line(initial_state,
                                                                           tmp_path):
  # Saved by an older version: its model config lacks options added since (the model
  # attention_bias=True computed then among them). Such checkpoints do not resume: the
  # refusal is one line naming each missing field.
  config, state = initial_state
  manager = checkpoints.checkpoint_manager(str(tmp_path / "checkpoints"), None)
  saved = checkpoints.model_config_dict(config.model)
  for option in ("attention_bias", "length_multiple"):
    saved.pop(option)
  saved["attention_kwargs"].pop("block_diagonal")   # attention options too
  checkpoints.save_checkpoint(manager, 2, state.replace(step=2), {"model_config": saved})
  with pytest.raises(errors.ConfigMismatchError) as raised:
    checkpoints.restore_checkpoint(manager, state, model_config=config.model)
  message = str(raised.value)
  assert "\n" not in message
  for line in ("model.attention_bias: checkpoint '<absent>', config False",
               "model.attention_kwargs.block_diagonal: checkpoint '<absent>', config False",
               "model.length_multiple: checkpoint '<absent>', config 1"):
    assert line in message


def test_a_checkpoint_of_an_earlier_release_is_refused_in_one_line(initial_state, tmp_path):
  # Saved by a release before checkpoint formats (issue 46; every checkpoint from before
  # model.attention_bias existed among them): refused, named, and left where it is.
  config, state, manager = _saved_steps(tmp_path, initial_state)
  for step in manager.all_steps():
    path = tmp_path / "checkpoints" / str(step) / "meta" / "metadata"
    meta = json.loads(path.read_text())
    assert meta.pop(checkpoints.FORMAT_KEY) == checkpoints.FORMAT
    path.write_text(json.dumps(meta))
  with pytest.raises(errors.ConfigMismatchError,
                     match=r"checkpoints/4 was saved by an earlier release of simpletron-jax "
                           r"\(checkpoint format 1, this release reads 3\)") as info:
    checkpoints.restore_checkpoint(manager, state, model_config=config.model,
                                   quarantine_dir=str(tmp_path / "damaged"))
  assert "\n" not in str(info.value)
  assert manager.all_steps() == [2, 4] and not (tmp_path / "damaged").exists()


def test_a_skipped_save_stops_with_path_and_reason(initial_state, tmp_path):
  config, state, manager = _saved_steps(tmp_path, initial_state, steps=(6,))
  with pytest.raises(errors.CheckpointError, match=r"orbax skipped saving step 4 .*step 6"):
    checkpoints.save_checkpoint(manager, 4, state, {})


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_checkpoint_folder(initial_state, tmp_path):
  config, state, manager = _saved_steps(tmp_path, initial_state, steps=(2,))
  os.chmod(tmp_path / "checkpoints", 0o555)
  try:
    with pytest.raises(errors.CheckpointError, match=r"saving step 4 to .*checkpoints/4 failed"):
      checkpoints.save_checkpoint(manager, 4, state, {})
  finally:
    os.chmod(tmp_path / "checkpoints", 0o755)


@pytest.mark.slow
def test_save_failing_mid_run_stops_the_run(presence_task, tmp_path, monkeypatch):
  """A folder turned read-only in mid-run, simulated (the tests may run as root)."""
  real_save = ocp.CheckpointManager.save

  def read_only_save(self, step, *args, **kwargs):
    if step >= 4:
      raise PermissionError(13, "Permission denied", os.path.join(str(self.directory), "x"))
    return real_save(self, step, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, "save", read_only_save)
  workdir = str(tmp_path / "run")
  with pytest.raises(errors.CheckpointError,
                     match=r"saving step 4 to .*checkpoints/4 failed: Permission denied: "
                           r".*checkpoints/x \(PermissionError\)$"):
    trainer.train_and_evaluate(fault_config(), workdir, data=presence_task)
  assert not os.path.exists(os.path.join(workdir, "results.json"))


# ----------------------------------------------------------------------------
# NaN.


@pytest.mark.slow
def test_nan_stops_the_run_naming_step_and_last_good_checkpoint(presence_task, tmp_path):
  config = fault_config(learning_rate=1e6, warmup=1, num_train_steps=8, log_every=1)
  workdir = str(tmp_path / "run")
  with pytest.raises(errors.NonFiniteError) as error:
    trainer.train_and_evaluate(config, workdir, data=presence_task)
  match = re.match(r"step (\d+): training became non-finite .*last good checkpoint is "
                   r"(\S+)\.", str(error.value))
  assert match, str(error.value)
  nan_step = int(match.group(1))
  saved = checkpoints.checkpoint_manager(os.path.join(workdir, "checkpoints"), None).all_steps()
  assert all(s < nan_step for s in saved), (nan_step, saved)
  assert match.group(2).startswith("none") == (not saved)
  for step in saved:
    assert run_guard.tree_is_finite(_params(workdir, config, presence_task, step=step))
  assert not os.path.exists(os.path.join(workdir, "results.json"))
  _strict_json_lines(os.path.join(workdir, "metrics.jsonl"))


def test_logs_stay_strict_json(tmp_path):
  logger = MetricLogger(str(tmp_path))
  logger.write(1, {"loss": float("nan"), "accuracy": float("inf"), "count": 3}, "train")
  logger.close()
  (record,) = _strict_json_lines(tmp_path / "metrics.jsonl")
  assert record["loss"] is None and record["accuracy"] is None and record["count"] == 3
  assert atomic_io.json_safe({"a": [1.0, -math.inf], "b": np.float32("nan")}) == {
      "a": [1.0, None], "b": None}


# ----------------------------------------------------------------------------
# The best checkpoint: kept by orbax beside the newest.


def test_the_best_step_is_kept_beside_the_newest(initial_state, tmp_path):
  """max_to_keep=2 keeps steps 5 and 6; of the saves at a new best (2, then 4), 4 stays."""
  config, state = initial_state
  manager = checkpoints.checkpoint_manager(str(tmp_path / "checkpoints"), 2)
  for step in range(1, 7):
    checkpoints.save_checkpoint(manager, step, state.replace(step=step), {"run_id": "r"},
                                best={2: 0.5, 4: 0.7}.get(step))
  assert manager.all_steps() == [4, 5, 6]
  assert checkpoints.pick_step(manager, "best", "here") == 4
  assert checkpoints.pick_step(manager, "latest", "here") == 6
  empty = checkpoints.checkpoint_manager(str(tmp_path / "none"), 2)
  checkpoints.save_checkpoint(empty, 1, state, {"run_id": "r"})
  with pytest.raises(FileNotFoundError, match=r"here: no best-validation checkpoint in .*; the "
                     r"newest checkpoint is step 1 \(eval.py --which latest scores it\)$"):
    checkpoints.pick_step(empty, "best", "here")


def test_a_lost_best_checkpoint_falls_back_to_the_best_kept(initial_state, tmp_path):
  _, state = initial_state
  manager = checkpoints.checkpoint_manager(str(tmp_path / "checkpoints"), 3)
  for step, best in ((2, 0.5), (4, 0.7), (6, None)):
    saved = checkpoints.RunState(best_step=step, best_score=best, best_val_accuracy=best)
    checkpoints.save_checkpoint(manager, step, state.replace(step=step), saved.to_meta(),
                                best=best)
  manager.delete(4)
  run_state = checkpoints.RunState(best_step=4, best_score=0.7, best_val_accuracy=0.7,
                                   train_seconds=3.0)
  with pytest.warns(errors.RunWarning, match=r"step 4 is missing .*the best so far is now "
                                              r"step 2"):
    checkpoints.check_best(manager, run_state)
  assert run_state == checkpoints.RunState(best_step=2, best_score=0.5, best_val_accuracy=0.5,
                                           train_seconds=3.0)
  manager.delete(2)
  with pytest.warns(errors.RunWarning, match=r"step 2 is missing .*now none"):
    checkpoints.check_best(manager, run_state)
  assert run_state == checkpoints.RunState(train_seconds=3.0)


@pytest.mark.parametrize("metric,mode", [("accuracy", "max"), ("loss", "min")])
def test_the_best_metric_is_a_config_field(presence_task, tmp_path, metric, mode):
  """The best step is the first validation with the highest (or lowest) ``best_metric``, and
  the run keeps and tests that step's checkpoint."""
  config = fault_config(best_metric=metric, best_mode=mode, max_to_keep=1)
  workdir = str(tmp_path / "run")
  results = trainer.train_and_evaluate(config, workdir, data=presence_task)
  val = [(r[metric] if mode == "max" else -r[metric], -r["step"])
         for r in read_records(os.path.join(workdir, "metrics.jsonl")) if r["split"] == "val"]
  assert results["best_step"] == -max(val)[1]
  manager = checkpoints.checkpoint_manager(os.path.join(workdir, "checkpoints"), None)
  assert manager.all_steps() == sorted({results["best_step"], 10})
  assert checkpoints.pick_step(manager, "best", workdir) == results["best_step"]



# ----------------------------------------------------------------------------
# One run per workdir.


def _lock_holder(workdir):
  """A process that takes ``workdir``'s lock with :func:`run_folder.acquire_lock` and holds it
  until killed; returned once the lock is held."""
  code = ("import time; from simpletron_jax.run import run_folder; "
          f"run_folder.acquire_lock({str(workdir)!r}); print('held', flush=True); time.sleep(300)")
  holder = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
  assert holder.stdout.readline().strip() == "held"
  return holder


def test_second_run_on_a_workdir_is_refused_naming_pid_and_host(presence_task, tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "metrics.jsonl").write_text('{"step": 5, "split": "train"}\n')
  holder = _lock_holder(workdir)
  try:
    with pytest.raises(errors.WorkdirLockedError,
                       match=rf"in use by pid {holder.pid} on host '{socket.gethostname()}'"):
      trainer.train_and_evaluate(fault_config(), str(workdir), data=presence_task)
  finally:
    holder.kill()   # SIGKILL: the lock file stays, naming a process that is gone
    holder.wait()
  assert (workdir / "metrics.jsonl").read_text() == '{"step": 5, "split": "train"}\n'
  assert json.loads((workdir / run_folder.LOCK_FILE).read_text())["pid"] == holder.pid
  with pytest.warns(errors.RunWarning, match=rf"stale lock \(process {holder.pid} no longer"):
    lock = run_folder.acquire_lock(str(workdir))
  assert json.loads(open(lock.lock_file).read())["pid"] == os.getpid()
  run_folder.release_lock(lock)
  assert not os.path.exists(lock.lock_file)


def test_lock_of_another_host_or_torn_lock(tmp_path):
  lock = tmp_path / run_folder.LOCK_FILE
  lock.write_text(json.dumps({"pid": 1, "host": "elsewhere", "time": 0}))
  with pytest.raises(errors.WorkdirLockedError, match="pid 1 on host 'elsewhere'"):
    run_folder.acquire_lock(str(tmp_path))
  lock.write_text('{"pid": 12')  # torn by a kill while it was written
  with pytest.warns(errors.RunWarning, match="unreadable"):
    run_folder.release_lock(run_folder.acquire_lock(str(tmp_path)))
  assert not lock.exists()


def test_a_lock_left_by_an_unfinished_call_of_this_process_is_retaken(tmp_path):
  first = run_folder.acquire_lock(str(tmp_path))   # never released (an interrupted call)
  second = run_folder.acquire_lock(str(tmp_path))
  assert not first.is_locked and second.is_locked
  run_folder.release_lock(second)
  assert not (tmp_path / run_folder.LOCK_FILE).exists()


# ----------------------------------------------------------------------------
# Empty splits and settings.


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_empty_split_stops_before_training(presence_task, tmp_path, split):
  empty = RaggedExamples.from_sequences([], [])
  data = dataclasses.replace(presence_task, **{split: empty})
  with pytest.raises(ValueError, match=rf"the {split} split is empty; data source 'synthetic'"):
    trainer.train_and_evaluate(fault_config(), str(tmp_path / "run"), data=data)
  assert not os.path.exists(tmp_path / "run" / "checkpoints")


@pytest.mark.parametrize("field,value,message", [
    ("max_to_keep", 0, "max_to_keep=0 must be >= 1"),
    ("learning_rate", float("nan"), "learning_rate=nan must be a positive finite"),
    ("max_train_minutes", -1.0, "max_train_minutes=-1.0 must be >= 0"),
    ("best_metric", "f1", "best_metric='f1' / best_mode='max': best_metric must be one of "
                          "('loss', 'accuracy')"),
    ("best_mode", "up", "best_mode='up': best_metric must be one of"),
])
def test_meaningless_settings_are_refused(field, value, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    run_config.RunConfig.from_config_dict(fault_config(**{field: value}), n_devices=2)


def test_doubtful_settings_are_warned_about():
  with pytest.warns(errors.RunWarning, match="warmup=50 exceeds num_train_steps=10"):
    run_config.RunConfig.from_config_dict(fault_config(warmup=50), n_devices=2)
  with pytest.warns(errors.RunWarning, match="checkpoint_every=20 exceeds"):
    run_config.RunConfig.from_config_dict(fault_config(checkpoint_every=20), n_devices=2)


# ----------------------------------------------------------------------------
# Truncated files name themselves.


def test_truncated_metrics_log(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 1, "split": "train"}\n{"step": 2, "split": "tr')
  with pytest.warns(UserWarning, match=r"metrics.jsonl:2: dropping a torn last record"):
    assert [r["step"] for r in read_records(str(path))] == [1]
  path.write_text('{"step": 1, "split": "train"}\n{"step": 2, "spl\n{"step": 3}\n')
  with pytest.raises(ValueError, match=r"metrics.jsonl:2: "):
    MetricLogger(str(tmp_path), resume_step=3)


def _truncate_file(path, keep=0.5):
  data = open(path, "rb").read()
  open(path, "wb").write(data[:int(len(data) * keep)])


def test_truncated_jsonl_gz_and_jsonl(tmp_path):
  rows = "".join(json.dumps({"text": "review %d" % i, "label": i % 2}) + "\n" for i in range(200))
  gz = tmp_path / "imdb_train.jsonl.gz"
  gz.write_bytes(gzip.compress(rows.encode()))
  _truncate_file(gz)
  with pytest.raises(ValueError, match=rf"{re.escape(str(gz))}: damaged gzip file"):
    text.read_jsonl(str(gz))
  plain = tmp_path / "imdb_train.jsonl"
  plain.write_text(rows[:len(rows) // 2 + 7])
  with pytest.raises(ValueError, match=rf"{re.escape(str(plain))}:\d+: not valid JSON"):
    text.read_jsonl(str(plain))


def test_truncated_npz(tmp_path):
  path = tmp_path / "cifar10_gray_uint8.npz"
  images = np.zeros((4, 32, 32), np.uint8)
  np.savez_compressed(path, x_train=images, y_train=np.zeros(4), x_test=images,
                      y_test=np.zeros(4))
  _truncate_file(path, 0.7)
  with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: damaged"):
    image.read_npz(str(path))


def test_truncated_tsvs(tmp_path):
  listops_path = tmp_path / "basic_train.tsv"
  listops_path.write_text("Source\tTarget\n( ( [MAX 2 3 ] ) )\t3\n( ( [MIN 2")
  with pytest.raises(ValueError, match=rf"{re.escape(str(listops_path))}:3: expected 2"):
    listops.load_split(str(tmp_path), "train")
  aan = tmp_path / "new_aan_pairs.train.tsv"
  aan.write_text("1\ta\tb\tdoc one\tdoc two\n0\ta\tb\tdoc th")
  with pytest.raises(ValueError, match=rf"{re.escape(str(aan))}:2: expected 5"):
    retrieval.read_split(str(aan), 64)


def test_empty_run_id_file_names_itself(tmp_path):
  (tmp_path / run_folder.RUN_ID_FILE).write_text("")
  with pytest.raises(ValueError, match=rf"{re.escape(str(tmp_path))}/run_id: empty run id"):
    run_folder.RunFolder(str(tmp_path)).run_id(None)


# ----------------------------------------------------------------------------
# The command line: exit status and a one-line cause (subprocesses, slow).


@pytest.mark.slow
def test_cli_refuses_a_locked_workdir_and_stops_on_nan(tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  holder = _lock_holder(workdir)
  common = ["train.py", "--config", "configs/listops/simple.py:tiny",
            *SMALL_LISTOPS,
            "--config.num_train_steps=6",
            "--config.eval_frequency=3", "--config.checkpoint_every=3", "--config.warmup=1"]
  try:
    proc = subprocess.run([sys.executable, *common, "--workdir", str(workdir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
  finally:
    holder.kill()
    holder.wait()
  assert proc.returncode == 1 and f"pid {holder.pid}" in proc.stderr
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
  proc = subprocess.run([sys.executable, *common, "--workdir", str(tmp_path / "nan"),
                         "--config.learning_rate=1e6", "--config.log_every=1"],
                        cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 1, proc.stderr[-2000:]
  assert re.search(r"NonFiniteError: step \d+: training became non-finite", proc.stderr)
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
  proc = subprocess.run([sys.executable, *common, "--workdir", str(tmp_path / "typo"),
                         "--config.model.attention_kwargs.casual=True"],
                        cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 1 and "the config has no field 'casual'" in proc.stderr


# ----------------------------------------------------------------------------
# Command-line overrides of model.attention_kwargs.


def _parse_flags(*argv):
  """The config train.py would get from ``argv`` (absl + ml_collections config_flags)."""
  argv = ["train.py", *argv]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, flag_values=values, lock_config=True,
                                  sys_argv=argv)
  values(argv)
  return values.config


@pytest.mark.parametrize("model,option,value", [
    ("simple", "causal", True), ("performer", "num_features", 64), ("aft_full", "window", 4),
    ("reformer", "num_hashes", 2)])
def test_attention_option_overrides_work_on_the_command_line(model, option, value):
  config = _parse_flags(f"--config={ROOT}/configs/listops/{model}.py:tiny",
                        f"--config.model.attention_kwargs.{option}={value}",
                        "--config.model.max_length=50")
  assert config.model.attention_kwargs[option] == value
  if model == "aft_full":  # follows_max_length: still follows model.max_length (+1 for CLS)
    assert config.model.attention_kwargs.max_length == 51
  classifier = encoders.build_classifier(config.model, vocab_size=16, num_classes=2)
  assert classifier.encoder.config.attention_kwargs[option] == value


@pytest.mark.parametrize("name", attention.names())
def test_explicit_option_defaults_build_the_same_module(name):
  spec = attention.get(name)
  common = dict(num_heads=2, qkv_dim=8, out_dim=8, dropout_rate=0.0, dtype=jnp.float32)
  assert spec.build(**common, **spec.options()) == spec.build(**common)
  assert not set(spec.options()) & (set(attention.ENCODER_ARGS) | set(spec.fixed_kwargs))


def test_switched_attention_drops_the_old_defaults_but_not_unknown_options():
  config = _parse_flags(f"--config={ROOT}/configs/listops/simple.py:tiny",
                        "--config.model.attention=softmax")
  kwargs = dict(config.model.attention_kwargs)
  module = attention.get("softmax").build(num_heads=2, qkv_dim=8, out_dim=8, dropout_rate=0.0,
                                          dtype=jnp.float32, **kwargs)
  assert not hasattr(module, "chunk_size")
  with pytest.raises(ValueError, match=r"\['chunk_size'\], unknown to attention 'softmax'"):
    attention.get("softmax").build(num_heads=2, qkv_dim=8, out_dim=8, dropout_rate=0.0,
                                   dtype=jnp.float32, **{**kwargs, "chunk_size": 64})


def test_resume_with_another_optimizer_layout_is_a_config_error_not_damage(
    initial_state, presence_task, tmp_path):
  # grad_clip_norm > 0 wraps AdamW in a chain: the optimizer state has another layout, so the
  # checkpoint cannot be restored into it. That must be a config error, with the checkpoints
  # left where they are, not a damaged checkpoint set aside.
  config, state, manager = _saved_steps(tmp_path, initial_state)
  clipped = fault_config(grad_clip_norm=1.0)
  _, other = _state(clipped, presence_task)
  chex.assert_trees_all_equal_shapes(other.params, state.params)
  with pytest.raises(errors.ConfigMismatchError, match=r"checkpoints/4 .*grad_clip_norm"):
    checkpoints.restore_checkpoint(manager, other, model_config=clipped.model,
                                   quarantine_dir=str(tmp_path / "damaged"))
  assert manager.all_steps() == [2, 4] and not os.path.exists(tmp_path / "damaged")


def test_a_ctrl_c_that_python_dropped_stops_an_evaluation(presence_task, monkeypatch):
  """A real SIGINT whose KeyboardInterrupt Python drops (raised in a finalizer, as in JAX's
  ``_xla_gc_callback``) inside ``cli.sigint_raises`` (``train.py``) stops a validation or final
  test at its next batch, instead of being lost (issue 86: a Ctrl-C 1.5 s into the final test
  let the run finish with status 0)."""
  config = fault_config()
  model, state = _state(config, presence_task)
  _, p_eval = steps.pmap_steps(model.apply)
  batch_config = batches.BatchConfig.from_config_dict(config)
  params = steps.replicate(state.params)
  monkeypatch.setattr(sys, "unraisablehook", lambda lost: None)

  previous = signal.signal(signal.SIGINT, signal.default_int_handler)   # as in a terminal
  try:
    with cli.sigint_raises():
      InterruptedWhileCollected()   # dropped: nothing is raised here
      with pytest.raises(KeyboardInterrupt):
        evaluation.evaluate(p_eval, params, presence_task.test, batch_config)
    assert evaluation.evaluate(p_eval, params, presence_task.test, batch_config)["count"] == 200
  finally:
    signal.signal(signal.SIGINT, previous)
