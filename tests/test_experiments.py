"""The papers' experiment scripts (scripts/experiments/) end to end on a few steps of the
synthetic presence task (issue 12), run from a scratch working directory with their default
output folders (under ``runs/``; nothing under ``results/`` changes, issue 47)."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

from simpletron_jax.model import transfer
from simpletron_jax.train import saved_runs
from tests.test_no_overwrite import committed_unchanged  # noqa: F401  pylint: disable=W0611

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    "scripts", "experiments")


def _script(name):
  spec = importlib.util.spec_from_file_location(f"exp_{name}", os.path.join(HERE, f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
  """Runs the test in ``tmp_path``, where the scripts' relative default folders land."""
  monkeypatch.chdir(tmp_path)
  return tmp_path


def _argv(tmp_path, *extra):
  del tmp_path   # the defaults: runs/experiments/<name>/ under the working directory
  # The presence task's sequences are shorter than 40 tokens: 48 positions hold them, where
  # the :tiny configs' 200 (ListOps) and 512 (text) would only add padding to run. Dropout
  # off: each train step then compiles without the random bits of its dropout masks (a
  # third of its compile time); these tests check the scripts' runs, surgery and outputs,
  # and dropout is tested with the train step (test_train.py and others). Bucket 0: every
  # batch at the 48 positions, so each model compiles one eval step, not one per width
  # (ListOps' bucket of 32 gave the sorted eval batches two).
  return ["--quick", "--steps", "2", "--eval_every", "1", "--config.model.max_length=48",
          "--config.model.dropout_rate=0", "--config.model.attention_dropout_rate=0",
          "--config.data.bucket=0", *extra]


def _runs(tmp_path, name):
  return tmp_path / "runs" / "experiments" / name


def _outputs(tmp_path, name):
  for ext in ("json", "md", "png"):
    assert os.path.getsize(_runs(tmp_path, name) / f"{name}.{ext}") > 0
  assert not (tmp_path / "results").exists()
  with open(_runs(tmp_path, name) / f"{name}.json") as f:
    return json.load(f)


def _qkv(params):
  return {p: v for p, v in transfer.flatten(params).items()
          if "attention/query" in p or "attention/key" in p or "attention/value" in p}


@pytest.mark.slow
def test_attention_transfer_quick(in_tmp, presence_task, committed_unchanged):  # noqa: F811
  tmp_path = in_tmp
  payload = _script("attention_transfer").main(_argv(tmp_path, "--tasks", "listops"),
                                               data=presence_task)
  runs = payload["results"]["listops"]
  assert set(runs) == {"simple", "softmax_scratch", "softmax_transfer"}
  assert all(len(r["val_curve"]) == 2 for r in runs.values())
  # The transferred q/k/v are the source's and stayed frozen through training.
  source = _qkv(saved_runs.load_run(runs["simple"]["workdir"]).params())
  moved = _qkv(saved_runs.load_run(runs["softmax_transfer"]["workdir"], "latest").params())
  # q/k/v kernels of 2 blocks (no attention biases, as LRA's)
  assert sorted(source) == sorted(moved) and len(source) == 6
  for path, value in source.items():
    np.testing.assert_array_equal(value, moved[path], err_msg=path)
  with open(os.path.join(runs["softmax_transfer"]["workdir"], "transfer.json")) as f:
    report = json.load(f)
  assert sorted(report["copied"]) == sorted(source)


@pytest.mark.slow
def test_attention_swap_quick(in_tmp, presence_task, committed_unchanged):  # noqa: F811
  tmp_path = in_tmp
  payload = _script("attention_swap").main(
      _argv(tmp_path, "--targets", "simple", "--finetune_steps", "2", "--lora_rank", "4"),
      data=presence_task)
  rows = payload["table"]["simple"]
  assert list(rows) == ["all layers", "first 1", "last 1", "LoRA r=4", "full retraining",
                        "unswapped"]
  assert all(0.0 <= acc <= 1.0 for acc in rows.values())
  # Unswapped re-evaluates the softmax run's best checkpoint: its own test accuracy.
  assert rows["unswapped"] == pytest.approx(payload["base"]["test_accuracy_best_val"], abs=1e-6)
  # Simple has no output projection: swapping every layer drops both W_o (no biases, as LRA).
  assert sorted(payload["surgery"]["simple/all layers"]["dropped"]) == sorted(
      f"encoder/encoderblock_{i}/attention/out/kernel" for i in range(2))
  assert payload["surgery"]["simple/last 1"]["dropped"] == [
      "encoder/encoderblock_1/attention/out/kernel"]
  _outputs(tmp_path, "attention_swap")


@pytest.mark.slow
def test_depth_quick(in_tmp, presence_task, committed_unchanged):  # noqa: F811
  tmp_path = in_tmp
  payload = _script("depth").main(
      _argv(tmp_path, "--attentions", "simple_res", "--depths", "1", "2", "--seeds", "0", "1"),
      data=presence_task)
  assert [(s["num_layers"], s["seeds"]) for s in payload["summary"]] == [(1, 2), (2, 2)]
  for run in payload["runs"]:
    assert len(run["blocks"]) == run["num_layers"]
    assert all(-1.0 <= b["symmetry"] <= 1.0 and b["spread"] > 0 for b in run["blocks"])
  with open(_runs(tmp_path, "depth") / "simple_res_L2_seed1" / "config.json") as f:
    config = json.load(f)
  assert (config["seed"], config["data"]["seed"], config["model"]["num_layers"]) == (1, 0, 2)
  accs = [r["test_accuracy"] for r in payload["runs"] if r["num_layers"] == 1]
  assert payload["summary"][0]["test_mean"] == pytest.approx(np.mean(accs))
  _outputs(tmp_path, "depth")
  # --finished_only reports the finished runs of a larger grid and trains nothing.
  report = _script("depth").main(
      _argv(tmp_path, "--attentions", "simple_res", "softmax", "--depths", "1", "2", "--seeds",
            "0", "1", "2", "--finished_only"), data=presence_task)
  assert report["runs"] == payload["runs"]
  assert not os.path.exists(_runs(tmp_path, "depth") / "simple_res_L1_seed2")


def test_symmetry_measure():
  depth = _script("depth")
  m = np.random.default_rng(0).normal(size=(4, 4))
  assert depth.symmetry(m + m.T) == pytest.approx(1.0)
  assert depth.symmetry(m - m.T) == pytest.approx(-1.0)
  assert depth.symmetry(np.array([[0.0, 1.0], [0.0, 0.0]])) == pytest.approx(0.0)


def test_only_a_finished_results_json_counts_as_done(tmp_path, monkeypatch):
  exp_common = _script("exp_common")
  config = exp_common.ml_collections.ConfigDict({"num_train_steps": 10, "seed": 0})
  workdir = tmp_path / "run"
  workdir.mkdir()
  assert not exp_common.finished(str(workdir))          # no results.json
  stopped = {"complete": False, "stopped_by": "max_train_minutes", "final_step": 4,
             "num_train_steps": 10, "test_accuracy": 0.3}
  (workdir / "results.json").write_text(json.dumps(stopped))
  assert not exp_common.finished(str(workdir))
  trained = []
  monkeypatch.setattr(exp_common.trainer, "train_and_evaluate",
                      lambda cfg, wd, data: trained.append(wd) or {**stopped, "complete": True,
                                                                  "final_step": 10})
  monkeypatch.setattr(exp_common, "read_records", lambda path: [])
  result = exp_common.train(config, str(workdir), data=None)
  assert trained == [str(workdir)] and result["complete"]   # resumed, not reused
  done = {**stopped, "complete": True, "final_step": 10, "stopped_by": None}
  (workdir / "results.json").write_text(json.dumps(done))
  assert exp_common.finished(str(workdir), config)
  exp_common.train(config, str(workdir), data=None)
  assert trained == [str(workdir)]                      # a finished run is read, not rerun


def test_overrides_take_train_pys_syntax_and_outputs_stay_under_runs(tmp_path, capsys):
  exp_common = _script("exp_common")
  parser = exp_common.make_parser("depth", "doc")
  args = parser.parse_args(["--quick", "--config.model.max_length", "64", "--steps", "7",
                            "--config.data.seed=3", "--config.model.attention_kwargs.causal=True"])
  assert args.config_overrides == ["--config.model.max_length=64", "--config.data.seed=3",
                                   "--config.model.attention_kwargs.causal=True"]
  config = exp_common.make_config(args, "listops", "simple", model__num_layers=1)
  assert (config.model.max_length, config.data.seed, config.num_train_steps) == (64, 3, 7)
  assert config.model.attention_kwargs.causal is True and config.model.num_layers == 1
  assert exp_common.out_dir(args) == os.path.join("runs", "experiments", "depth")
  with pytest.raises(SystemExit):   # the old syntax is gone, and the error says the new one
    parser.parse_args(["--override", "model.max_length=64"])
  assert "--override model.max_length=64 is written --config.model.max_length=64 now" in (
      capsys.readouterr().err)
  bad = parser.parse_args(["--quick", "--config.model.max_lenght=64"])
  with pytest.raises(ValueError, match=r"^the config has no field 'model.max_lenght' \(did "
                     r"you mean 'model.max_length'\?\)"):
    exp_common.make_config(bad, "listops", "simple")
  # --copy_to is the only way into a committed folder: the outputs, and only those, go there.
  args = parser.parse_args(["--runs", str(tmp_path / "runs"), "--copy_to",
                            str(tmp_path / "results" / "depth")])
  payload = exp_common.finish(args, "depth", {"rows": [1]}, "| a |\n", lambda fig: None)
  assert payload == {"experiment": "depth", "quick": False, "rows": [1]}
  assert sorted(os.listdir(tmp_path / "results" / "depth")) == ["depth.json", "depth.md",
                                                                 "depth.png"]
  assert sorted(os.listdir(tmp_path / "runs")) == ["depth.json", "depth.md", "depth.png"]
