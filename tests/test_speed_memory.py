"""Tests for benchmarks/speed_memory.py (the LRA Table 2 speed and memory benchmark)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys

import pytest

from simpletron_jax import attention

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_benchmark():
  spec = importlib.util.spec_from_file_location(
      "speed_memory", os.path.join(ROOT, "benchmarks", "speed_memory.py"))
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module   # dataclasses look their module up while it loads
  spec.loader.exec_module(module)
  return module


sm = _load_benchmark()
TINY = {"num_layers": 1, "emb_dim": 32, "qkv_dim": 32, "mlp_dim": 64, "num_heads": 4}


@pytest.fixture(scope="module")
def payload():
  """One run: softmax and simple at length 64, batch 2, 2 timed runs of 2 steps."""
  return sm.run_benchmark(labels=["softmax", "simple"], lengths=[64], batch=2, steps=2,
                          rounds=2, matmul_n=128, model_overrides=TINY, log=lambda _: None)


def test_labels_follow_the_registry():
  labels = sm.variant_labels()
  assert [lab for lab in labels if lab not in (sm.XLA, sm.FLASH)] == attention.names()
  i = labels.index("softmax")
  assert labels[i + 1:i + 3] == ["softmax_xla", "softmax_flash"]
  with pytest.raises(ValueError, match="--variants"):
    sm.variant_setup("no_such_attention", 64)


def test_variant_setup_sizes_max_length_and_disables_fused_dropout():
  for name in attention.names():
    fields = {f.name for f in dataclasses.fields(attention.get(name).module)}
    setup = sm.variant_setup(name, 100)
    if "max_length" in fields and "max_length" not in attention.get(name).fixed_kwargs:
      assert setup.attention_kwargs["max_length"] == 101
    else:
      assert "max_length" not in setup.attention_kwargs
  for label, impl in (("softmax_xla", "xla"), ("softmax_flash", "flash"),
                      ("softmax_fused", "xla")):   # the last: older result files' row
    fused = sm.variant_setup(label, 100)
    assert fused.attention_kwargs == {"implementation": impl}
    assert fused.model_overrides == {"attention_dropout_rate": 0.0}
  assert sm.variant_setup("softmax", 100).attention_kwargs == {"implementation": "einsum"}


def test_run_records_measurements_and_self_ratio(payload):
  records = {r["label"]: r for r in payload["results"]}
  assert set(records) == {"softmax", "simple"}
  for record in records.values():
    assert record["status"] == "ok", record.get("reason")
    assert record["length"] == 64 and record["batch"] == 2
    assert len(record["step_times_s"]) == 2 and record["fallbacks"] == []
    assert record["steps_per_sec"] == pytest.approx(1.0 / record["median_s_per_step"])
    assert record["memory_bytes"] > record["train_state_bytes"] > 0
    assert record["flops_per_step_per_device"] > 0
    assert 0 < record["achieved_fraction_of_peak"]
  assert records["softmax"]["speedup_vs_softmax"] == 1.0
  assert records["softmax"]["memory_ratio_vs_softmax"] == 1.0
  simple = records["simple"]
  assert simple["speedup_vs_softmax"] == pytest.approx(
      simple["steps_per_sec"] / records["softmax"]["steps_per_sec"])
  assert simple["fastest_softmax"] == "softmax"   # the only softmax row in this run


def test_outputs_json_and_markdown(payload, tmp_path):
  paths = sm.write_outputs(payload, str(tmp_path))
  with open(paths["json"]) as f:
    data = json.load(f)
  for key in ("schema_version", "settings", "machine", "memory_metric", "baseline", "results",
              "time_ratio"):
    assert key in data
  assert data["machine"]["jax"] and data["machine"]["matmul_peak"]["float32"]["flops_per_s"] > 0
  assert data["settings"]["model"]["num_layers"] == 1
  with open(paths["md"]) as f:
    text = f.read()
  assert "| model | 64 |" in text
  assert "| `softmax` | " in text and "(1.00x)" in text
  assert "## Peak memory, GiB" in text
  try:
    import matplotlib  # noqa: F401
  except ImportError:
    return
  assert os.path.getsize(paths["png"]) > 0


def test_oom_is_recorded_and_longer_lengths_skipped():
  # A memory limit below the train state: OOM at the first length without compiling.
  out = sm.run_benchmark(labels=["simple"], lengths=[32, 64], batch=2, steps=1, rounds=1,
                         matmul_n=64, max_memory_gb=1e-6, model_overrides=TINY,
                         log=lambda _: None)
  statuses = [(r["length"], r["status"]) for r in out["results"]]
  assert statuses == [(32, "OOM"), (64, "skipped")]
  assert "OOM" in sm.markdown_report(out)


def test_oom_from_the_compiled_memory_estimate(payload):
  # A limit between the train state and the compiled estimate (both x 2 CPU devices, which
  # share RAM): compiled, recorded as OOM from the estimate, never run.
  simple = next(r for r in payload["results"] if r["label"] == "simple")
  state, estimate = simple["train_state_bytes"], simple["memory_analysis"]["estimate_bytes"]
  assert estimate > state
  out = sm.run_benchmark(labels=["simple"], lengths=[64, 128], batch=2, steps=1, rounds=1,
                         matmul_n=64, max_memory_gb=(state + estimate) / sm.GIB,
                         model_overrides=TINY, log=lambda _: None)
  oom, skipped = out["results"]
  assert (oom["status"], skipped["status"]) == ("OOM", "skipped")
  assert "compiled memory estimate" in oom["reason"] and "compile_s" in oom
  assert "median_s_per_step" not in oom


def test_partial_records_let_a_killed_run_resume(tmp_path, monkeypatch):
  partial = str(tmp_path / "{device}" / "speed_memory.partial.jsonl")
  kwargs = dict(labels=["simple", "linear"], lengths=[32], batch=2, steps=1, rounds=1,
                matmul_n=64, max_memory_gb=1e-6, model_overrides=TINY, log=lambda _: None,
                partial_path=partial)
  first = sm.run_benchmark(**kwargs)
  path = partial.replace("{device}", first["machine"]["device_slug"])
  with open(path) as f:
    lines = f.readlines()
  assert [json.loads(line)["record"]["label"] for line in lines] == ["simple", "linear"]
  with open(path, "w") as f:   # killed while writing the second record
    f.write(lines[0] + lines[1][:20])
  calls = []
  real = sm.measure_config

  def counting(**task):
    calls.append((task["label"], task["length"]))
    return real(**task)
  monkeypatch.setattr(sm, "measure_config", counting)
  resumed = sm.run_benchmark(**kwargs, resume=True)
  assert calls == [("linear", 32)]
  assert [r.get("resumed", False) for r in resumed["results"]] == [True, False]
  assert resumed["results"][0]["status"] == first["results"][0]["status"] == "OOM"
  # Other settings do not reuse the file's records; without resume the file starts over.
  assert sm.load_partial(path, {"batch": 4, "dtype": "float32", "steps": 1,
                                "model_overrides": TINY}) == {}
  sm.run_benchmark(**kwargs)
  assert len(calls) == 3


def test_ratios_against_fastest_softmax_and_missing_baseline():
  def ok(label, length, sps, mem):
    return {"label": label, "length": length, "status": "ok", "steps_per_sec": sps,
            "memory_bytes": mem}
  results = [ok("softmax", 1, 2.0, 100), ok("softmax_flash", 1, 4.0, 50), ok("simple", 1, 8.0, 20),
             {"label": "softmax", "length": 2, "status": "OOM"}, ok("simple", 2, 1.0, 10)]
  sm.add_ratios(results)
  simple1, simple2 = results[2], results[4]
  assert simple1["speedup_vs_softmax"] == 4.0 and simple1["memory_ratio_vs_softmax"] == 0.2
  assert simple1["fastest_softmax"] == "softmax_flash"
  assert simple1["speedup_vs_fastest_softmax"] == 2.0
  assert simple1["memory_ratio_vs_fastest_softmax"] == 0.4
  assert simple2["speedup_vs_softmax"] is None and simple2["fastest_softmax"] is None


def test_schema_1_result_files_still_render():
  with open(os.path.join(ROOT, "benchmarks", "results", "cpu", "speed_memory.json")) as f:
    old = json.load(f)
  if old.get("schema_version") != 1:
    pytest.skip("the committed CPU table was regenerated with schema 2")
  text = sm.markdown_report(old)
  assert "one fresh process per cell" in text and "cost_analysis" in text
  assert "| `softmax_fused` |" in text
