"""Issue 27, part B: no silent resume, every config field validated before any work, and one
line instead of a traceback for every user error (train.py, eval.py, scripts/experiments).

Most cases call the functions directly; validation runs before any data, compilation or
checkpoint. The resume cases (slow: they compile a train step) share one run killed after its
first checkpoint (a module fixture) and copy it; one slow test runs the command lines (three
subprocesses) end to end.
"""

import dataclasses
import gzip
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from absl import flags
from ml_collections import config_flags

from configs import lra
from simpletron_jax.data import common, listops, retrieval, tasks, text
from simpletron_jax.runtime import cli, errors
from simpletron_jax.train import checkpoints, config_checks, final_test, run_config, trainer
from simpletron_jax.run import run_folder, run_record
from tests.conftest import ROOT, presence_examples
from tests.test_train import Killed, tiny_config


def small_config(**overrides):
  """A 1-layer model on 24 tokens: 6 steps, checkpoints and validation every 2."""
  base = {"num_train_steps": 6, "checkpoint_every": 2, "eval_frequency": 2, "warmup": 5,
          "data.bucket": 0, "model.max_length": 24, "model.num_layers": 1}
  return tiny_config(**{**base, **overrides})


def _kill_at(step_to_kill):
  def hook(step):
    if step >= step_to_kill:
      raise Killed()
  return hook


@pytest.fixture(scope="module")
def killed_run(presence_task, tmp_path_factory):
  """A workdir whose run was killed after step 2's checkpoint."""
  workdir = str(tmp_path_factory.mktemp("killed") / "run")
  with pytest.raises(Killed):
    trainer.train_and_evaluate(small_config(), workdir, data=presence_task,
                               step_hook=_kill_at(2))
  return workdir


@pytest.fixture
def resumable(killed_run, tmp_path):
  """A private copy of :func:`killed_run`'s workdir."""
  workdir = str(tmp_path / "run")
  shutil.copytree(killed_run, workdir)
  return workdir


def _history(workdir):
  with open(os.path.join(workdir, "config.json")) as f:
    return json.load(f).get(run_record.CONFIG_HISTORY_KEY, [])


# ----------------------------------------------------------------------------
# 1. Resume refuses what changes the computation.


@pytest.mark.slow
def test_resume_with_another_seed_lr_and_batch_lists_each_field(resumable, presence_task):
  changed = small_config(seed=1, learning_rate=0.01, batch_size=8)
  with pytest.raises(errors.ConfigMismatchError) as info:
    trainer.train_and_evaluate(changed, resumable, data=presence_task,
                               step_hook=_kill_at(1))
  message = str(info.value)
  for line in ("seed: checkpoint 0, config 1", "data.seed: checkpoint 0, config 1",
               "learning_rate: checkpoint 0.05, config 0.01",
               "batch_size: checkpoint 16, config 8", "--allow_resume_changes"):
    assert line in message, message
  assert "\n" not in message
  # Nothing was continued or rewritten: the newest checkpoint is still step 2, and config.json
  # still holds the checkpoint's seed.
  assert sorted(os.listdir(os.path.join(resumable, "checkpoints"))) == ["2"]
  with open(os.path.join(resumable, "config.json")) as f:
    assert json.load(f)["seed"] == 0


@pytest.mark.slow
def test_resume_with_other_data_or_fewer_steps_is_refused(resumable, presence_task):
  other = dataclasses.replace(presence_task,
                              train=presence_examples(2000, np.random.default_rng(7)))
  with pytest.raises(errors.ConfigMismatchError, match=r"data \(sha256 of the loaded "
                     r"splits\): checkpoint '[0-9a-f]{12}', config '[0-9a-f]{12}'"):
    trainer.train_and_evaluate(small_config(), resumable, data=other)
  with pytest.raises(errors.ConfigMismatchError,
                     match=r"num_train_steps \(only upward.*checkpoint 6, config 4"):
    trainer.train_and_evaluate(small_config(num_train_steps=4), resumable,
                               data=presence_task)


@pytest.mark.slow
def test_reporting_changes_resume_and_are_recorded(resumable, presence_task, capsys):
  config = small_config(eval_frequency=3, log_every=1, num_train_steps=8)
  with pytest.raises(Killed):
    trainer.train_and_evaluate(config, resumable, data=presence_task, step_hook=_kill_at(3))
  # Truncation (max_length 24 on examples of up to 39 tokens): each split once.
  err = capsys.readouterr().err
  for split in ("train", "val", "test"):
    assert len(re.findall(rf"truncation: model.max_length=24 truncates \d+ of \d+ {split} ",
                          err)) == 1, err
  [entry] = _history(resumable)
  assert entry["step"] == 2 and entry["forced"] is False
  assert entry["changes"]["eval_frequency"] == {"old": 2, "new": 3, "allowed": True}
  assert entry["changes"]["num_train_steps"] == {"old": 6, "new": 8, "allowed": True}
  assert run_folder.RunFolder(resumable).saved_config().eval_frequency == 3   # history stripped


@pytest.mark.slow
def test_forced_changes_are_recorded_as_history(resumable, presence_task):
  changed = small_config(seed=1)
  with pytest.raises(Killed):
    trainer.train_and_evaluate(changed, resumable, data=presence_task,
                               step_hook=_kill_at(3), allow_resume_changes=True)
  [entry] = _history(resumable)
  assert entry["forced"] is True and entry["step"] == 2
  assert entry["changes"]["seed"] == {"old": 0, "new": 1, "allowed": False}
  # model.* stays refused even with the flag.
  with pytest.raises(errors.ConfigMismatchError, match=r"model.dropout_rate: checkpoint "
                     r"0.1, config 0.0.*model.\* fields cannot change"):
    trainer.train_and_evaluate(small_config(seed=1, **{"model.dropout_rate": 0.0}),
                               resumable, data=presence_task, allow_resume_changes=True)


def _as_earlier_release(workdir):
  """Rewrites every checkpoint's meta as a release before issue 46 saved it: no checkpoint
  format and no run record."""
  steps = os.listdir(os.path.join(workdir, "checkpoints"))
  assert steps
  for step in steps:
    path = os.path.join(workdir, "checkpoints", step, "meta", "metadata")
    if os.path.exists(path):
      with open(path) as f:
        meta = json.load(f)
      assert meta.pop(checkpoints.FORMAT_KEY) == checkpoints.FORMAT
      meta.pop(run_record.RECORD_KEY)
      with open(path, "w") as f:
        json.dump(meta, f)


@pytest.mark.slow
def test_a_checkpoint_of_an_earlier_release_is_refused_in_one_line(resumable, presence_task):
  _as_earlier_release(resumable)
  for config in (small_config(), small_config(seed=1)):
    with pytest.raises(errors.ConfigMismatchError) as info:
      trainer.train_and_evaluate(config, resumable, data=presence_task)
    message = str(info.value)
    assert "\n" not in message and "earlier release" in message, message
    assert os.path.join(resumable, "checkpoints") in message and "new --workdir" in message
  assert os.path.isdir(os.path.join(resumable, "checkpoints"))   # refused, not set aside
  assert not os.path.exists(os.path.join(resumable, "damaged"))


def test_devices_and_task_sizes_are_named():
  # A ListOps checkpoint resumed with the text config: the vocabulary and class count first.
  listops_cfg, text_cfg = (lra.make_config(t, "simple", "tiny") for t in ("listops", "text"))
  saved = run_record.run_record(listops_cfg, vocab_size=listops.VOCAB_SIZE,
                                num_classes=listops.NUM_CLASSES, num_devices=1, num_hosts=1)
  now = run_record.run_record(text_cfg, vocab_size=text.VOCAB_SIZE,
                              num_classes=text.NUM_CLASSES, num_devices=2, num_hosts=1)
  with pytest.raises(errors.ConfigMismatchError) as info:
    run_record.check_resume("ckpt/4", saved, now)
  message = str(info.value)
  assert message.startswith(
      f"ckpt/4 was computed with other settings: vocab_size (of the task's data: the "
      f"embedding's rows): checkpoint {listops.VOCAB_SIZE}, config {text.VOCAB_SIZE}; "
      f"num_classes (of the task's data: the output layer's width): checkpoint "
      f"{listops.NUM_CLASSES}, config {text.NUM_CLASSES}; number of devices"), message
  assert "task: checkpoint 'listops', config 'text'" in message
  assert "optimizer" not in message
  changes = run_record.check_resume("ckpt/4", saved, now, allow_changes=True)
  assert {"field": "num_devices", "old": 1, "new": 2, "allowed": False} in changes


def test_config_fingerprint_ignores_reporting_fields_only():
  config = small_config()
  fingerprint = run_record.config_fingerprint(config)
  assert re.fullmatch(r"[0-9a-f]{64}", fingerprint)
  for field, value in (("eval_frequency", 5), ("log_every", 1), ("num_train_steps", 60),
                       ("data.cache_dir", "/elsewhere")):
    assert run_record.config_fingerprint(small_config(**{field: value})) == fingerprint, field
  for field, value in (("seed", 3), ("learning_rate", 0.1), ("batch_size", 8),
                       ("num_test_steps", 4), ("model.num_layers", 2)):
    assert run_record.config_fingerprint(small_config(**{field: value})) != fingerprint, field
  # A config.json dict (with a history) gives the config's fingerprint.
  tree = {**json.loads(config.to_json_best_effort()), run_record.CONFIG_HISTORY_KEY: [{}]}
  assert run_record.config_fingerprint(tree) == fingerprint
  # With a cosine schedule the step count is the schedule's period: it counts.
  cosine = small_config(factors="constant * linear_warmup * cosine_decay")
  longer = small_config(factors="constant * linear_warmup * cosine_decay", num_train_steps=60)
  assert run_record.config_fingerprint(cosine) != run_record.config_fingerprint(longer)


# ----------------------------------------------------------------------------
# 2. Every field is validated before any work.


@pytest.mark.parametrize("field,value,message", [
    ("model.dropout_rate", 1.0, "model.dropout_rate=1.0 must be in [0, 1)"),
    ("model.dropout_rate", -0.1, "model.dropout_rate=-0.1 must be in [0, 1)"),
    ("model.attention_dropout_rate", 1.5, "model.attention_dropout_rate=1.5 must be in [0, 1)"),
    ("batch_size", 0, "batch_size=0 must be >= 1"),
    ("log_every", 0, "log_every=0 must be >= 1"),
    ("seed", -1, "seed=-1 must be >= 0"),
    ("model.num_heads", 3, "model.qkv_dim=16 is not divisible by model.num_heads=3"),
    ("model.emb_dim", 0, "model.emb_dim=0 must be >= 1"),
    ("eval_batch_size", -4, "eval_batch_size=-4 must be >= 0"),
    ("task", "listop", "task='listop' is not a task; known: agnews, image, listops, pathfinder"),
    ("model.attention", "nope", "unknown attention 'nope' (config field model.attention); "
                                "known: aft_full"),
    ("model.classifier_pool", "MAX", "model.classifier_pool='MAX'; expected one of"),
    ("data.bucket", -8, "data.bucket=-8 must be >= 0"),
    ("num_eval_steps", -2, "num_eval_steps=-2 must be >= -1"),
    ("model.max_length", 10**9, "model.max_length=1000000000 makes a position table of "
                                "1000000001 x 16 float32 values (59.6 GiB), over the 4 GiB "
                                "limit: set model.max_length"),
])
def test_bad_model_data_and_batch_fields_are_refused(field, value, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    run_config.RunConfig.from_config_dict(small_config(**{field: value}), n_devices=2)


@pytest.mark.parametrize("field,value,message", [
    ("weight_decay", -0.1, "weight_decay=-0.1 must be >= 0"),
    ("adam_b2", 1.0, "adam_b2=1.0 must be in [0, 1)"),
    ("grad_clip_norm", -1.0, "grad_clip_norm=-1.0 must be >= 0"),
    ("warmup", -5, "warmup=-5 must be >= 0"),
    ("factors", "constant * cosine", "unknown learning-rate factor(s) ['cosine']"),
    ("adam_eps", 0.0, "adam_eps=0.0 must be > 0 (Adam divides by sqrt(nu) + adam_eps"),
    ("freeze", ("[",), "freeze[0]='[': not a regular expression (unterminated character set"),
    ("init_include", ("^encoder/", "a("), "init_include[1]='a(': not a regular expression"),
    ("lora.targets", ("*x",), "lora.targets[0]='*x': not a regular expression (nothing to "
                              "repeat"),
])
def test_bad_optimizer_fields_are_refused(field, value, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    run_config.RunConfig.from_config_dict(small_config(**{field: value}), n_devices=2)


def test_a_tiny_adam_eps_and_a_long_table_within_the_limit_pass():
  run_config.TrainConfig.from_config_dict(small_config(adam_eps=1e-12, freeze=("^encoder/embed/",)))
  config_checks.check_position_table(16384, 1024)   # Path-X's length at a wide model: 64 MiB
  with pytest.raises(ValueError, match=r"^model.max_length=1048576 makes .* over the 1 GiB"):
    config_checks.check_position_table(2**20, 256, limit=2**30)


def _parsed(*argv, program="train.py"):
  """The config ``program`` gets from ``argv``, the override flags defined from ``argv`` as
  train.py's are (from ``sys.argv``)."""
  argv = [program, *argv]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, flag_values=values, lock_config=True,
                                  sys_argv=argv)
  cli.parse_flags(argv, program, flag_values=values)
  return values.config


def test_seed_and_data_seed_are_independent_settings(monkeypatch):
  """docs/fidelity.md: data.seed follows seed unless it is set itself; setting data.seed never
  moves seed (it did, through a shared ml_collections reference). Likewise the attention's
  own max_length (docs/configs.md) follows model.max_length, and setting it leaves
  model.max_length alone."""
  monkeypatch.chdir(ROOT)
  spec = "--config=configs/listops/simple.py:tiny"
  config = _parsed(spec, "--config.data.seed=1")
  assert (config.seed, config.data.seed) == (0, 1)
  config = _parsed(spec, "--config.seed=3")
  assert (config.seed, config.data.seed) == (3, 3)
  for order in (("--config.seed=3", "--config.data.seed=1"),
                ("--config.data.seed=1", "--config.seed=3")):
    config = _parsed(spec, *order)
    assert (config.seed, config.data.seed) == (3, 1), order
  config = lra.make_config("listops", "simple", "tiny")
  config.data.seed = 7
  config.seed = 5
  assert (config.seed, config.data.seed) == (5, 7)
  assert json.loads(config.to_json_best_effort())["data"]["seed"] == 7
  # The default config's fingerprint (and so every committed results.json) is unchanged:
  # data.seed is still written as the seed's value.
  default = lra.make_config("listops", "simple", "tiny")
  assert json.loads(default.to_json_best_effort())["data"]["seed"] == 0
  config = _parsed("--config=configs/listops/aft_full.py:tiny",
                   "--config.model.attention_kwargs.max_length=77")
  assert (config.model.max_length, config.model.attention_kwargs.max_length) == (200, 77)
  config = _parsed("--config=configs/listops/aft_full.py:tiny", "--config.model.max_length=50")
  assert config.model.attention_kwargs.max_length == 51


def test_validation_runs_before_any_work(tmp_path, presence_task):
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=re.escape("model.dropout_rate=1.0 must be in [0, 1)")):
    trainer.train_and_evaluate(small_config(**{"model.dropout_rate": 1.0}), str(workdir),
                               data=presence_task)
  assert not workdir.exists()


def test_every_shipped_config_passes_validation():
  for task in tasks.lra_tasks():
    for name in ("simple", "softmax", "performer"):
      for variant in (None,) + lra.variants(task, name):
        config = lra.make_config(task, name, variant)
        run_config.RunConfig.from_config_dict(config, n_devices=2)


def test_truncation_is_reported_with_counts(tmp_path, presence_task, capsys):
  report = common.truncation_report("train", [10, 30, 50], 20)
  assert report.startswith("model.max_length=20 truncates 2 of 3 train examples (66.7%): 40 "
                           "of 90 tokens cut (44.4%), 20 on average and at most 30"), report
  assert common.truncation_report("train", [10, 20], 20) is None
  # A split kept whole (cut per batch), as train_and_evaluate reports it before training.
  assert common.report_split_truncation("val", presence_task.val, 24)
  assert "truncation: model.max_length=24 truncates" in capsys.readouterr().err
  # Loaders that cut while reading (text, retrieval) report the full lengths.
  with gzip.open(tmp_path / "imdb_train.jsonl.gz", "wt") as f:
    for i, n in enumerate((5, 40, 12)):
      f.write(json.dumps({"text": "a" * n, "label": i % 2}) + "\n")
  shutil.copy(tmp_path / "imdb_train.jsonl.gz", tmp_path / "imdb_test.jsonl.gz")
  text.load_text(data_dir=str(tmp_path), tfds_data_dir=None, max_length=10, seed=0,
                 val_fraction=0)
  err = capsys.readouterr().err
  assert "truncates 2 of 3 train examples (66.7%): 32 of 57 bytes cut" in err, err
  assert "truncates 2 of 3 test examples" in err, err
  tsv = tmp_path / "pairs.tsv"
  tsv.write_text("1\ta\tb\t" + "x" * 30 + "\tyy\n0\tc\td\tz\tw\n")
  retrieval.read_split(str(tsv), 8, split="val")
  err = capsys.readouterr().err
  assert "truncates 1 of 2 val (first documents) examples" in err, err
  assert "second documents" not in err, err


# ----------------------------------------------------------------------------
# 3. One line for every user error; tracebacks for bugs.


def _flag_values(*argv, program="train.py"):
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, flag_values=values, lock_config=True)
  return cli.parse_flags([program, *argv], program, flag_values=values)


@pytest.mark.parametrize("argv,message", [
    (("--config=configs/listops/nope.py",), "train.py: --config configs/listops/nope.py: no "
     "such config file; the configs in configs/listops: aft_full.py"),
    (("--config=configs/listops/simple.py:tinyy",), "train.py: flag --config=configs/listops/"
     "simple.py:tinyy: unknown config variant 'tinyy' for task 'listops'; known: ('tiny'"),
    (("--config=configs/listops/simple.py:tiny", "--config.batch_sise=8"),
     "train.py: --config.batch_sise: the config has no field 'batch_sise' (did you mean "
     "'batch_size'"),
])
def test_flag_errors_are_one_line(argv, message, monkeypatch):
  monkeypatch.chdir(ROOT)
  with pytest.raises(SystemExit) as info:
    _flag_values(*argv)
  text_ = str(info.value.code)
  assert text_.startswith(message) and "\n" not in text_, text_


@pytest.mark.parametrize("program,argv,message", [
    # An override makes ml_collections load the file while parsing it: an OSError.
    ("train.py", ("--config=configs/listops/nope.py", "--config.seed=1"),
     "train.py: --config configs/listops/nope.py: no such config file; the configs in "
     "configs/listops: aft_full.py"),
    ("eval.py", ("--workdir=x", "--config=configs/listops/nope.py", "--config.seed=1"),
     "eval.py: --config configs/listops/nope.py: no such config file"),
    ("train.py", ("--config={bad}",), "train.py: --config {bad}: the file cannot be loaded: "
     "SyntaxError at {bad}:2: "),
    ("train.py", ("--config={bad}:tiny", "--config.seed=1"),
     "train.py: --config {bad}: the file cannot be loaded: SyntaxError at {bad}:2: "),
    ("train.py", ("--config=configs/listops/simple.py:tiny", "runs/x"),
     "train.py: unexpected argument(s) 'runs/x': train.py takes flags only, as --name=value"),
])
def test_config_load_errors_are_one_line(program, argv, message, monkeypatch, tmp_path):
  """As train.py and eval.py parse them: the override flags defined from the command line."""
  monkeypatch.chdir(ROOT)
  bad = tmp_path / "broken.py"
  bad.write_text("def get_config():\n  return (\n")
  argv = [a.replace("{bad}", str(bad)) for a in argv]
  values = flags.FlagValues()
  values_argv = [program, *argv]
  config_flags.DEFINE_config_file("config", None, flag_values=values, lock_config=True,
                                  sys_argv=values_argv)
  if program == "eval.py":
    flags.DEFINE_string("workdir", None, "", flag_values=values)
  with pytest.raises(SystemExit) as info:
    cli.parse_flags(values_argv, program, flag_values=values)
  text_ = str(info.value.code)
  assert text_.startswith(message.replace("{bad}", str(bad))) and "\n" not in text_, text_


def test_a_workdir_name_that_is_not_utf8_is_refused_naming_the_bytes(tmp_path):
  name = os.fsdecode(os.fsencode(str(tmp_path)) + b"/run\xff")   # as sys.argv holds it
  with pytest.raises(ValueError, match=r"^--workdir '.*run\\udcff': its name holds b'\\xff', "
                                       r"which is not UTF-8 text"):
    run_folder.RunFolder(name).create()
  assert os.listdir(tmp_path) == []
  cli.check_path_name(str(tmp_path / "run_ü"), "--workdir")   # UTF-8 is fine


def test_user_errors_and_bugs_are_told_apart(tmp_path):
  with pytest.raises(SystemExit, match=r"^x.py: --workdir '.*' is a file, not a folder"):
    with cli.user_errors_exit("x.py"):
      (tmp_path / "f").write_text("")
      run_folder.RunFolder(str(tmp_path / "f")).create()
  with pytest.raises(SystemExit, match=r"^x.py: CheckpointError: gone"):
    with cli.user_errors_exit("x.py"):
      raise errors.CheckpointError("gone")
  with pytest.raises(NotADirectoryError):       # --verbose: the traceback stays
    with cli.user_errors_exit("x.py", verbose=True):
      run_folder.RunFolder(str(tmp_path / "f")).create()
  with pytest.raises(ValueError, match="cannot reshape"):   # raised inside numpy: a bug
    with cli.user_errors_exit("x.py"):
      np.zeros(3).reshape(2, 2)
  with pytest.raises(KeyError):                 # another type: a bug
    with cli.user_errors_exit("x.py"):
      raise KeyError("x")


def test_eval_of_a_missing_workdir_creates_nothing(tmp_path):
  with pytest.raises(FileNotFoundError, match="is not a folder: pass the workdir"):
    final_test.evaluate_checkpoint(str(tmp_path / "nowhere"))
  assert not (tmp_path / "nowhere").exists()


def test_experiment_override_typo_is_one_line(tmp_path, monkeypatch, capsys):
  sys.path.insert(0, os.path.join(ROOT, "scripts", "experiments"))
  try:
    import depth  # pylint: disable=import-outside-toplevel
    import exp_common  # pylint: disable=import-outside-toplevel
  finally:
    sys.path.pop(0)
  monkeypatch.setattr(sys, "argv", ["depth.py"])
  argv = ["--quick", "--config.model.nope.x=1", "--runs", str(tmp_path / "r"),
          "--out", str(tmp_path / "o")]   # train.py's override syntax (issue 47, item 5)
  with pytest.raises(SystemExit, match=r"^depth.py: the config has no field 'model.nope'; "
                     r"--config.model.nope.x sets existing fields only"):
    exp_common.run_cli(depth.main, argv)
  assert not (tmp_path / "r").exists()


def _run(*args):
  return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=600)


@pytest.mark.slow
def test_cli_user_errors_are_one_line_and_verbose_keeps_the_traceback(tmp_path):
  common_args = ["train.py", "--config", "configs/listops/simple.py:tiny",
                 f"--config.data.cache_dir={tmp_path / 'cache'}", "--workdir",
                 str(tmp_path / "run"), "--config.model.num_heads=3"]
  proc = _run(*common_args)
  assert proc.returncode == 1, proc.stderr[-2000:]
  lines = [line for line in proc.stderr.splitlines() if line.startswith("train.py:")]
  assert lines == [lines[0]] and "model.num_heads=3" in lines[0], proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()
  proc = _run(*common_args, "--verbose")
  assert proc.returncode == 1 and "Traceback" in proc.stderr, proc.stderr[-2000:]
  proc = _run("eval.py", "--workdir", str(tmp_path / "nowhere"))
  assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert "eval.py: --workdir" in proc.stderr and not (tmp_path / "nowhere").exists()
