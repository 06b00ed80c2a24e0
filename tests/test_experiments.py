"""The papers' experiment scripts (scripts/experiments/) end to end on a few steps of the
synthetic presence task (issue 12)."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

from simpletron_jax import transfer

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    "scripts", "experiments")


def _script(name):
  spec = importlib.util.spec_from_file_location(f"exp_{name}", os.path.join(HERE, f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _argv(tmp_path, *extra):
  return ["--quick", "--steps", "2", "--eval-every", "1", "--out", str(tmp_path / "out"),
          "--runs", str(tmp_path / "runs"), *extra]


def _outputs(tmp_path, name):
  for ext in ("json", "md", "png"):
    assert os.path.getsize(tmp_path / "out" / f"{name}.{ext}") > 0
  with open(tmp_path / "out" / f"{name}.json") as f:
    return json.load(f)


def _qkv(params):
  return {p: v for p, v in transfer.flatten(params).items()
          if "attention/query" in p or "attention/key" in p or "attention/value" in p}


@pytest.mark.slow
def test_attention_transfer_quick(tmp_path, presence_task):
  payload = _script("attention_transfer").main(_argv(tmp_path, "--tasks", "listops"),
                                               data=presence_task)
  runs = payload["results"]["listops"]
  assert set(runs) == {"simple", "softmax_scratch", "softmax_transfer"}
  assert all(len(r["val_curve"]) == 2 for r in runs.values())
  # The transferred q/k/v are the source's and stayed frozen through training.
  source = _qkv(transfer.load_run_params(runs["simple"]["workdir"]))
  moved = _qkv(transfer.load_run_params(runs["softmax_transfer"]["workdir"], "latest"))
  # q/k/v kernels of 2 blocks (no attention biases, as LRA's)
  assert sorted(source) == sorted(moved) and len(source) == 6
  for path, value in source.items():
    np.testing.assert_array_equal(value, moved[path], err_msg=path)
  with open(os.path.join(runs["softmax_transfer"]["workdir"], "transfer.json")) as f:
    report = json.load(f)
  assert sorted(report["copied"]) == sorted(source)


@pytest.mark.slow
def test_attention_swap_quick(tmp_path, presence_task):
  payload = _script("attention_swap").main(
      _argv(tmp_path, "--targets", "simple", "--finetune-steps", "2", "--lora-rank", "4"),
      data=presence_task)
  rows = payload["table"]["simple"]
  assert list(rows) == ["all layers", "first 1", "last 1", "LoRA r=4", "full retraining",
                        "unswapped"]
  assert all(0.0 <= acc <= 1.0 for acc in rows.values())
  # Unswapped re-evaluates the softmax run's best checkpoint: its own test accuracy.
  assert rows["unswapped"] == pytest.approx(payload["base"]["test_accuracy"], abs=1e-6)
  # Simple has no output projection: swapping every layer drops both W_o (no biases, as LRA).
  assert sorted(payload["surgery"]["simple/all layers"]["dropped"]) == sorted(
      f"encoder/encoderblock_{i}/attention/out/kernel" for i in range(2))
  assert payload["surgery"]["simple/last 1"]["dropped"] == [
      "encoder/encoderblock_1/attention/out/kernel"]
  _outputs(tmp_path, "attention_swap")


@pytest.mark.slow
def test_depth_quick(tmp_path, presence_task):
  payload = _script("depth").main(
      _argv(tmp_path, "--attentions", "simple_res", "--depths", "1", "2", "--seeds", "0", "1"),
      data=presence_task)
  assert [(s["num_layers"], s["seeds"]) for s in payload["summary"]] == [(1, 2), (2, 2)]
  for run in payload["runs"]:
    assert len(run["blocks"]) == run["num_layers"]
    assert all(-1.0 <= b["symmetry"] <= 1.0 and b["spread"] > 0 for b in run["blocks"])
  with open(tmp_path / "runs" / "simple_res_L2_seed1" / "config.json") as f:
    config = json.load(f)
  assert (config["seed"], config["data"]["seed"], config["model"]["num_layers"]) == (1, 0, 2)
  accs = [r["test_accuracy"] for r in payload["runs"] if r["num_layers"] == 1]
  assert payload["summary"][0]["test_mean"] == pytest.approx(np.mean(accs))
  _outputs(tmp_path, "depth")
  # --finished-only reports the finished runs of a larger grid and trains nothing.
  report = _script("depth").main(
      _argv(tmp_path, "--attentions", "simple_res", "softmax", "--depths", "1", "2", "--seeds",
            "0", "1", "2", "--finished-only"), data=presence_task)
  assert report["runs"] == payload["runs"]
  assert not os.path.exists(tmp_path / "runs" / "simple_res_L1_seed2")


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
  monkeypatch.setattr(exp_common.train_lib, "train_and_evaluate",
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
