"""The README's entry points, run as a user would: train.py generates data into a
cache, trains, writes results.json; eval.py restores the best checkpoint and
reproduces the test accuracy (its steps precompiled); a bad config field fails with a clear message."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT, SMALL_LISTOPS


def _run(*args, check=True):
  proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=600)
  if check and proc.returncode:
    raise AssertionError(f"{args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
  return proc


SMALL = [*SMALL_LISTOPS, "--config.eval_frequency=2", "--config.num_train_steps=3"]


@pytest.mark.slow
def test_train_then_eval(tmp_path, monkeypatch):
  workdir = str(tmp_path / "run")
  monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  _run("train.py", "--config", "configs/listops/simple.py:tiny", "--workdir", workdir,
       f"--xla_cache_dir={tmp_path / 'xla'}", *SMALL,
       f"--config.data.cache_dir={tmp_path / 'cache'}")   # after SMALL's shared folder
  assert os.listdir(tmp_path / "xla"), "train.py must write its compiled steps to the cache"
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  assert results["attention"] == "simple" and results["final_step"] == 3
  # The whole software stack (issue 63): the ecosystem's versions; no GPU fields on a CPU.
  for key in ("jax_version", "flax_version", "clu_version", "grain_version",
              "tensorboard_version", "ml_collections_version"):
    assert isinstance(results[key], str) and results[key], key
  assert all(results[key] is None for key in ("cuda_version", "cudnn_version",
                                              "cuda_driver_version", "nvidia_driver_version"))
  assert os.listdir(tmp_path / "cache" / "listops"), "data must be generated into the cache"
  records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  assert [r["step"] for r in records if r["split"] == "val"] == [2, 3]
  # eval.py with its steps compiled first, in 2 threads: the same accuracy as train.py's.
  proc = _run("eval.py", "--workdir", workdir, "--split", "test", "--precompile_workers=2")
  with open(os.path.join(workdir, "eval_best_test.json")) as f:
    evaluated = json.load(f)
  assert evaluated["accuracy"] == results["test_accuracy_best_val"], proc.stdout
  assert evaluated["step"] == results["best_step"] and evaluated["count"] == 32
  assert re.search(r"precompiled [1-9]\d* eval step shapes", proc.stderr), proc.stderr[-2000:]


@pytest.mark.parametrize("override,message", [
    ("--config.model.attention=nope", "unknown attention 'nope'"),
    ("--config.model.qkv_dim=32", r"model.qkv_dim \(32\) must equal model.emb_dim \(64\)"),
])
def test_bad_config_is_reported(tmp_path, override, message):
  proc = _run("train.py", "--config", "configs/listops/simple.py:tiny", "--workdir",
              str(tmp_path / "run"), *SMALL,
              override, check=False)
  assert proc.returncode != 0
  assert re.search(message, proc.stderr), proc.stderr[-2000:]


def test_missing_data_dir_is_reported(tmp_path):
  proc = _run("train.py", "--config", "configs/listops/transformer.py:tiny", "--workdir",
              str(tmp_path / "run"), f"--config.data.data_dir={tmp_path / 'nowhere'}",
              check=False)
  assert proc.returncode != 0
  assert "nowhere/basic_train.tsv" in proc.stderr


def test_config_files_load_without_the_removed_load_module(tmp_path, monkeypatch):
  """--config files load through exec_module: on Python 3.15, which removed
  ``SourceFileLoader.load_module()`` (made to raise here), a file with a ``:variant`` and an
  override still loads, with no DeprecationWarning, and a shipped config loads too."""
  import warnings
  import importlib.machinery
  from absl import flags
  from ml_collections import config_flags
  from simpletron_jax.runtime import cli, overrides  # noqa: F401  (cli replaces the loader)

  def removed(self, *args):
    raise AttributeError("'SourceFileLoader' object has no attribute 'load_module'")

  monkeypatch.setattr(importlib.machinery.SourceFileLoader, "load_module", removed)
  path = tmp_path / "my_config.cfg"   # config_flags takes any suffix
  path.write_text("import ml_collections\n\n\ndef get_config(variant=None):\n"
                  "  config = ml_collections.ConfigDict()\n"
                  "  config.variant, config.size = variant, 1\n  return config\n")
  values = flags.FlagValues()
  with warnings.catch_warnings():
    warnings.simplefilter("error", DeprecationWarning)
    argv = ["prog", f"--config={path}:tiny", "--config.size=3"]
    config_flags.DEFINE_config_file("config", None, flag_values=values, sys_argv=argv)
    values(argv)
    shipped = overrides.load_config("configs/listops/simple.py:tiny", ["--config.seed=5"])
  assert (values.config.variant, values.config.size) == ("tiny", 3)
  assert shipped.seed == 5 and shipped.model.attention == "simple"
