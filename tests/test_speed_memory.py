"""Tests for benchmarks/speed_memory.py (the LRA Table 2 speed and memory benchmark)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
import threading

import jax
import pytest

from simpletron_jax.model import attention

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_benchmark(name):
  """Imports ``benchmarks/<name>.py`` (a script folder, not a package)."""
  spec = importlib.util.spec_from_file_location(
      name, os.path.join(ROOT, "benchmarks", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module   # dataclasses look their module up while it loads
  spec.loader.exec_module(module)
  return module


sm = _load_benchmark("speed_memory")
TINY = {"num_layers": 1, "emb_dim": 32, "qkv_dim": 32, "mlp_dim": 64, "num_heads": 4}
# The runs that compile and time cells, without dropout: each train step then compiles without
# the masks' random bits (a third of its compile time); these tests check the benchmark's
# records, not dropout. (TINY itself is speed_options.py --quick's model, so the cell that
# the hlo_cost test prepares shares its programs with that script's through the session's
# compilation cache.)
TINY_RUN = {**TINY, "dropout_rate": 0.0, "attention_dropout_rate": 0.0}


@pytest.fixture(scope="module")
def payload():
  """One run: softmax and simple at length 64, batch 2, 2 timed runs of 2 steps (the
  1000 s run time caps nothing), the two cells compiled side by side in 2 threads."""
  return sm.run_benchmark(labels=["softmax", "simple"], lengths=[64], batch=2, steps=2,
                          rounds=2, matmul_n=128, model_overrides=TINY_RUN, log=lambda _: None,
                          compile_workers=2, run_seconds=1000.0)


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
    assert record["wall_s"] == record["prepare_wall_s"] + record["run_wall_s"]
    assert set(record["phase_s"]) == {"init_compile", "flop_count", "init", "warmup", "probe",
                                      "timed"}
    assert record["steps_per_run"] == 2 and record["probe_s"] > 0
  assert payload["settings"]["compile_workers"] == 2
  assert payload["wall_s"] >= max(r["wall_s"] for r in records.values())
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
                         model_overrides=TINY_RUN, log=lambda _: None)
  oom, skipped = out["results"]
  assert (oom["status"], skipped["status"]) == ("OOM", "skipped")
  assert "compiled memory estimate" in oom["reason"] and "compile_s" in oom
  assert "median_s_per_step" not in oom
  # Compiled alone here and beside softmax in a thread there: the same program.
  assert oom["memory_analysis"] == simple["memory_analysis"]
  assert oom["flop_count"] == simple["flop_count"]


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
  real = sm.prepare_cell

  def counting(label, length, *args):
    calls.append((label, length))
    return real(label, length, *args)
  monkeypatch.setattr(sm, "prepare_cell", counting)
  resumed = sm.run_benchmark(**kwargs, resume=True)
  assert calls == [("linear", 32)]
  assert [r.get("resumed", False) for r in resumed["results"]] == [True, False]
  assert resumed["results"][0]["status"] == first["results"][0]["status"] == "OOM"
  # Other settings do not reuse the file's records; without resume the file starts over.
  assert sm.load_partial(path, {"batch": 4, "dtype": "float32", "steps": 1,
                                "model_overrides": TINY}) == {}
  sm.run_benchmark(**kwargs)
  assert len(calls) == 3


def test_run_seconds_cuts_the_runs_of_slow_cells_only():
  assert sm.steps_per_run(10, 0.0, 5.0) == 10          # off
  assert sm.steps_per_run(10, 2.0, 0.01) == 10         # fast: capped at --steps
  assert sm.steps_per_run(10, 2.0, 0.5) == 4
  assert sm.steps_per_run(10, 2.0, 5.0) == 1           # slower than the budget: one step
  # The payload's simple cell (length 64, TINY_RUN): its programs come from the session's
  # compilation cache.
  out = sm.run_benchmark(labels=["simple"], lengths=[64], batch=2, steps=3, rounds=2,
                         matmul_n=64, model_overrides=TINY_RUN, log=lambda _: None,
                         run_seconds=1e-9)
  (record,) = out["results"]
  assert record["status"] == "ok" and record["steps_per_run"] == 1
  assert len(record["step_times_s"]) == 2
  assert "up to 3 (as many as fit in 1e-09 s)" in sm.markdown_report(out)
  with pytest.raises(ValueError, match="--run_seconds"):
    sm.run_benchmark(labels=["simple"], lengths=[32], run_seconds=-1.0)


def test_a_run_that_measured_nothing_does_not_exit_0(tmp_path):
  # Every cell fails validation at once (length_multiple is refused for Linformer).
  bad = ["--set", "length_multiple=8", "--lengths", "32", "--batch", "2", "--cache_dir", ""]
  with pytest.raises(SystemExit, match="speed_memory: no cell ran"):
    sm.main(["--variants", "linformer", "--steps", "1", "--rounds", "1", "--matmul_n", "64",
             "--out", str(tmp_path / "sm"), *bad])
  assert os.path.exists(tmp_path / "sm" / "speed_memory.md")   # the reasons are written
  with pytest.raises(SystemExit, match="hlo_pads: no cell compiled"):
    _load_benchmark("hlo_pads").main(["--variant", "linformer", "--out",
                                      str(tmp_path / "hp"), *bad])
  assert os.path.exists(tmp_path / "hp" / "hlo_pads.md")


def test_dashed_flags_of_the_earlier_release_parse_as_the_underscored_ones(capsys):
  underscored = ["--cache_dir", "", "--compile_workers", "2", "--run_seconds", "1.5",
                 "--matmul_n", "64", "--max_memory_gb", "3", "--in_process"]
  dashed = [a.replace("_", "-") if a.startswith("--") else a for a in underscored]
  old = sm.parse_args(dashed)
  notes = capsys.readouterr().err.splitlines()
  new = sm.parse_args(underscored)
  assert vars(old) == vars(new)
  assert (new.cache_dir, new.compile_workers, new.run_seconds, new.matmul_n,
          new.max_memory_gb, new.in_process) == ("", 2, 1.5, 64, 3.0, True)
  assert capsys.readouterr().err == "", "the underscored spelling draws no note"
  assert len(notes) == 6 and all(n.startswith("speed_memory.py: --") and
                                 "is deprecated: write --" in n for n in notes), notes


def test_a_cell_that_failed_beside_others_is_prepared_again_alone(monkeypatch):
  calls = []

  def fake_prepare(label, length, *args):
    calls.append((label, threading.current_thread() is threading.main_thread()))
    if label == "b" and len(calls) <= 2:   # fails in the pool, as under memory pressure
      return {"label": label, "status": "OOM", "error_type": "XlaRuntimeError"}, None
    return {"label": label, "status": "compiling"}, object()
  monkeypatch.setattr(sm, "prepare_cell", fake_prepare)
  lines = []
  out = sm.prepare_cells(["a", "b", "c"], 64, 2, "float32", None, None, workers=2,
                         log=lines.append)
  assert sorted(calls) == [("a", False), ("b", False), ("b", True), ("c", False)]
  assert out["b"][0] == {"label": "b", "status": "compiling", "retried_alone": True}
  assert out["b"][1] is not None and "retried_alone" not in out["a"][0]
  assert len(lines) == 4 and "compiled b" in lines[-1]


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
  # The CPU table committed before the single-process benchmark (e886b90), cut to 3 rows.
  with open(os.path.join(ROOT, "tests", "fixtures", "speed_memory", "schema1_cpu.json")) as f:
    old = json.load(f)
  assert old["schema_version"] == 1
  text = sm.markdown_report(old)
  assert "one fresh process per cell" in text and "cost_analysis" in text
  assert "| `softmax_fused` |" in text


def _trace(process, lines):
  """A Perfetto JSON trace: one process, ``lines`` maps a thread name to its events
  ``(name, dur_us)``."""
  events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": process}}]
  for tid, (line, evs) in enumerate(lines.items()):
    events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid,
                   "args": {"name": line}})
    events += [{"ph": "X", "pid": 1, "tid": tid, "ts": 0, "name": n, "dur": d} for n, d in evs]
  return {"traceEvents": events}


# Optimized GPU HLO in the form XLA prints it: a padded operand fed to a cuBLAS gemm through a
# fusion, and an unpadded cuBLASLt matmul.
_PADDED_GEMM_HLO = """
%fused_computation.3 (param_0.1: bf16[32,4097,64]) -> bf16[32,4104,64] {
  %param_0.1 = bf16[32,4097,64]{2,1,0} parameter(0)
  %constant.2 = bf16[] constant(0)
  ROOT %pad.1 = bf16[32,4104,64]{2,1,0} pad(bf16[32,4097,64]{2,1,0} %param_0.1, bf16[] %constant.2), padding=0_0x0_7x0_0
}

ENTRY %main.9 (Arg_0.1: bf16[32,4097,64]) -> bf16[32,64,64] {
  %Arg_0.1 = bf16[32,4097,64]{2,1,0} parameter(0)
  %loop_pad_fusion = bf16[32,4104,64]{2,1,0} fusion(bf16[32,4097,64]{2,1,0} %Arg_0.1), kind=kLoop, calls=%fused_computation.3
  %custom-call.1 = (bf16[32,64,64]{2,1,0}, s8[1024]{0}) custom-call(bf16[32,4104,64]{2,1,0} %loop_pad_fusion, bf16[32,4104,64]{2,1,0} %Arg_0.1), custom_call_target="__cublas$gemm"
  %get-tuple-element.1 = bf16[32,64,64]{2,1,0} get-tuple-element((bf16[32,64,64]{2,1,0}, s8[1024]{0}) %custom-call.1), index=0
  %custom-call.2 = (bf16[32,64,64]{2,1,0}, s8[1024]{0}) custom-call(bf16[32,64,64]{2,1,0} %get-tuple-element.1, bf16[32,64,64]{2,1,0} %get-tuple-element.1), custom_call_target="__cublas$lt$matmul"
  ROOT %get-tuple-element.2 = bf16[32,64,64]{2,1,0} get-tuple-element((bf16[32,64,64]{2,1,0}, s8[1024]{0}) %custom-call.2), index=0
}
"""


def test_hlo_pads_finds_the_padded_gemm_operand():
  hp = _load_benchmark("hlo_pads")
  found = hp.count_pads(_PADDED_GEMM_HLO)
  assert found["matmuls"] == 2
  assert found["pads"] == [{"computation": "fused_computation.3", "name": "pad.1",
                            "shape": "bf16[32,4104,64]{2,1,0}", "padding": "0_0x0_7x0_0"}]
  assert found["padded_matmul_operands"] == [
      {"matmul": "custom-call.1", "target": "__cublas$gemm", "operand": "loop_pad_fusion"}]
  text = hp.markdown([{"label": "simple", "positions": 4097, "status": "ok",
                       **found, "n_pads": 1, "n_padded_matmul_operands": 1}], "h")
  assert "| `simple` | 4097 | 1 | 1 | 2 | bf16[32,4104,64]{2,1,0} 0_0x0_7x0_0 |" in text


def test_profile_counts_each_kernel_once():
  prof = _load_benchmark("profile_step")
  # GPU: kernels on the stream; the module span and the per-op line repeat them.
  gpu = _trace("/device:GPU:0", {
      "Stream #13(Compute)": [("nvjet_gemm", 30.0), ("loop_add_fusion", 10.0)] * 2,
      "XLA Ops": [("dot.1", 30.0), ("add.2", 10.0)] * 2,
      "XLA Modules": [("jit_train_step(1)", 45.0)] * 2,
      "Launch Stats": [("cuLaunchKernel", 1.0)] * 4})
  events, tracks = prof.device_events(gpu)
  assert tracks == ["/device:GPU:0 / Stream #13(Compute)"]
  summary = prof.summarize(events, steps=2, top=5)
  assert summary["device_us_per_step"] == pytest.approx(40.0)
  assert summary["kinds"] == pytest.approx({"matmul": 0.75, "fusion (elementwise)": 0.25})
  assert prof.module_us_per_step(gpu, steps=2) == pytest.approx(45.0)
  # TPU: no streams, the XLA Ops line is the kernel line.
  tpu = _trace("/device:TPU:0", {"XLA Ops": [("fusion.3", 5.0)],
                                 "XLA Modules": [("jit_step", 6.0)]})
  assert [e["name"] for e in prof.device_events(tpu)[0]] == ["fusion.3"]
  # CPU: the thunk executor's "end: " marker repeats each thunk; host frames are not kernels.
  cpu = _trace("/host:CPU", {"tf_XLAEigen/1": [("dot.7", 4.0), ("end: dot.7", 4.0)],
                             "python": [("train.py:12 step", 9.0)]})
  events, _ = prof.device_events(cpu)
  assert [e["name"] for e in events] == ["dot.7"] and prof.module_us_per_step(cpu, 1) is None
  with pytest.raises(ValueError, match="no kernel events.*Launch Stats"):
    prof.device_events(_trace("/device:GPU:0", {"Launch Stats": [("x", 1.0)]}))


def test_profile_names_the_op_each_kernel_comes_from():
  prof = _load_benchmark("profile_step")
  hlo = """
ENTRY %main.9 (Arg_0.1: bf16[8,64]) -> bf16[8,64] {
  %Arg_0.1 = bf16[8,64]{1,0} parameter(0)
  %loop_pad_fusion.8 = bf16[8,64]{1,0} fusion(bf16[8,64]{1,0} %Arg_0.1), kind=kLoop, calls=%c.1, metadata={op_name="pmap(train_step)/jit(main)/transpose(jvp(ClassificationEncoder))/encoder/encoderblock_2/SimpleAttention_0/dot_general" source_file="x.py" source_line=3}
  ROOT %wrapped_transpose.1 = bf16[8,64]{0,1} fusion(bf16[8,64]{1,0} %loop_pad_fusion.8), kind=kInput, calls=%c.2, metadata={op_name="pmap(train_step)/jit(main)/jvp(ClassificationEncoder)/encoder/encoderblock_0/MlpBlock_0/mul"}
}
"""
  sources = prof.hlo_sources(hlo)
  assert sources["loop_pad_fusion_8"] == sources["loop_pad_fusion.8"]
  # On CPU, threefry's rounds run as plain fusions: their source says random bits.
  sources["broadcast_add_fusion.6"] = ("jit(_fun)/jvp(ClassificationEncoder)/encoder/"
                                       "Dropout_0/jit(_bernoulli)/jit(_uniform)/add")
  events = [{"name": n, "dur": d} for n, d in (
      ("loop_pad_fusion_8", 3.0), ("wrapped_transpose_1", 2.0), ("nvjet_sm90", 2.0),
      ("broadcast_add_fusion.6", 1.0), ("ynn_fusion.151", 1.0), ("select_fusion", 1.0))]
  summary = prof.summarize(events, steps=1, top=6, sources=sources)
  assert [(k["kind"], k["source"] != "") for k in summary["kernels"]] == [
      ("fusion (elementwise)", True), ("copy / transpose", True), ("matmul", False),
      ("random bits", True), ("matmul", False), ("fusion (elementwise)", False)]
  assert summary["kinds"]["random bits"] == pytest.approx(0.1)
  text = prof.summary_text(summary, "h")
  assert "from backward encoderblock_2/SimpleAttention_0/dot_general" in text
  assert "from encoderblock_0/MlpBlock_0/mul" in text


# Optimized GPU HLO as XLA prints it: a fusion reading one parameter through a slice, a
# cuBLASLt matmul with a bias epilogue, a transpose, and a fusion holding a dot.
_COST_HLO = """
%fused_slice (param_0: f32[64,1024], param_1: f32[64]) -> f32[64,8] {
  %param_0 = f32[64,1024]{1,0} parameter(0)
  %slice.1 = f32[64,8]{1,0} slice(%param_0), slice={[0:64], [0:8]}
  %param_1 = f32[64]{0} parameter(1)
  %broadcast.1 = f32[64,8]{1,0} broadcast(%param_1), dimensions={0}
  ROOT %add.1 = f32[64,8]{1,0} add(%slice.1, %broadcast.1)
}

%gemm_body (p0: bf16[16,32], p1: bf16[32,8]) -> bf16[16,8] {
  %p0 = bf16[16,32]{1,0} parameter(0)
  %p1 = bf16[32,8]{1,0} parameter(1)
  ROOT %dot.1 = bf16[16,8]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main.1 (a: f32[64,1024], b: f32[64], x: bf16[128,256], w: bf16[256,512], c: bf16[512], p: bf16[16,32], q: bf16[32,8]) -> bf16[512,128] {
  %a = f32[64,1024]{1,0} parameter(0)
  %b = f32[64]{0} parameter(1)
  %x = bf16[128,256]{1,0} parameter(2)
  %w = bf16[256,512]{1,0} parameter(3)
  %c = bf16[512]{0} parameter(4)
  %p = bf16[16,32]{1,0} parameter(5)
  %q = bf16[32,8]{1,0} parameter(6)
  %loop_add_fusion = f32[64,8]{1,0} fusion(%a, %b), kind=kLoop, calls=%fused_slice, metadata={op_name="jit(step)/jvp(ClassificationEncoder)/encoder/encoderblock_0/LayerNorm_0/add"}
  %cublas-lt-matmul.1 = (bf16[128,512]{1,0}, s8[4194304]{0}) custom-call(%x, %w, %c), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(step)/jvp(ClassificationEncoder)/encoder/encoderblock_0/MlpBlock_0/Dense_0/dot_general"}, backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]},"epilogue":"BIAS"}}
  %get-tuple-element.1 = bf16[128,512]{1,0} get-tuple-element(%cublas-lt-matmul.1), index=0
  %gemm_fusion_dot.1 = bf16[16,8]{1,0} fusion(%p, %q), kind=kCustom, calls=%gemm_body
  ROOT %transpose.1 = bf16[512,128]{1,0} transpose(%get-tuple-element.1), dimensions={1,0}
}
"""


def test_hlo_cost_charges_bytes_and_flops_by_hand_count():
  hc = _load_benchmark("hlo_cost")
  rows = {r["name"]: r for r in hc.kernel_costs(_COST_HLO, bandwidth=1e9, matmul_peak=1e12)}
  assert list(rows) == ["loop_add_fusion", "cublas-lt-matmul.1", "gemm_fusion_dot.1",
                        "transpose.1"]   # parameters and tuple plumbing are free
  # The fusion reads 64 x 8 of its 64 x 1024 parameter, all of the bias, writes 64 x 8.
  assert rows["loop_add_fusion"]["bytes"] == 64 * 8 * 4 + 64 * 4 + 64 * 8 * 4
  assert rows["loop_add_fusion"]["part"] == "layer norm"
  # x, w and the bias in; the result out (the cuBLAS workspace is not traffic).
  gemm = rows["cublas-lt-matmul.1"]
  assert gemm["bytes"] == (128 * 256 + 256 * 512 + 512 + 128 * 512) * 2
  assert gemm["flops"] == 2 * 128 * 512 * 256 and gemm["kind"] == "matmul"
  assert gemm["model_s"] == pytest.approx(max(gemm["bytes"] / 1e9, gemm["flops"] / 1e12))
  assert gemm["part"] == "MLP"
  assert rows["gemm_fusion_dot.1"]["flops"] == 2 * 16 * 8 * 32
  assert rows["transpose.1"]["kind"] == "copy/transpose"
  assert rows["transpose.1"]["bytes"] == 2 * 128 * 512 * 2
  summary = hc.summarize(list(rows.values()), top=1)
  assert summary["model_ms"] == pytest.approx(sum(r["model_s"] for r in rows.values()) * 1e3)
  assert summary["top"][0]["name"] == "cublas-lt-matmul.1"   # the most bytes
  assert set(summary["by_part"]) == {"layer norm", "MLP", "optimizer and other"}
  with pytest.raises(ValueError, match="no ENTRY"):
    hc.kernel_costs("%f (a: f32[1]) -> f32[1] {\n}\n", 1.0, 1.0)
  with pytest.raises(ValueError, match="no kernel in the entry computation"):
    hc.kernel_costs("ENTRY %m (a: f32[1]) -> f32[1] {\n  ROOT %a = f32[1]{0} parameter(0)\n}\n",
                    1.0, 1.0)


def test_hlo_cost_counts_the_steps_matmul_flops_on_the_local_backend(tmp_path):
  hc = _load_benchmark("hlo_cost")
  tiny = "+".join(f"{k}={v}" for k, v in TINY.items())
  payload = hc.main(["--target", "local", "--specs", f"simple+{tiny}", "no_such_variant",
                     # one block, no dropout: less to compile
                     "configs/listops/simple.py:tiny+last_block_cls_only=true+num_layers=1"
                     "+dropout_rate=0.0+attention_dropout_rate=0.0",
                     "--lengths", "16", "--batch", "2", "--bandwidth", "1e10",
                     "--out", str(tmp_path)])
  ok, bad, from_file = payload["cells"]
  assert from_file["status"] == "ok" and from_file["flops"] > 0   # a config file's model
  assert bad["status"] == "error" and "unknown variant" in bad["reason"]
  # The HLO's matmul FLOPs are the analytic count of the step's dot_generals (flops.py);
  # hlo_cost compiles the whole batch for one device, speed_memory splits it over all.
  record, _ = sm.prepare_cell("simple", 16, 2, "bfloat16", None, hc.parse_spec(ok["spec"])[1])
  assert ok["flops"] == record["flops_per_step_per_device"] * jax.local_device_count()
  assert ok["by_kind"]["matmul"] > 0 and ok["model_ms"] > 0
  text = open(tmp_path / "hlo_cost.md").read()
  assert f"| `simple+{tiny}` | 16 |" in text and "unknown variant" in text
  with pytest.raises(SystemExit, match="hlo_cost: no cell compiled"):
    hc.main(["--target", "local", "--specs", "no_such_variant", "--out", str(tmp_path)])
  with pytest.raises(ValueError, match="expected FIELD=VALUE"):
    hc.main(["--target", "local", "--specs", "simple+emb_dim", "--out", str(tmp_path)])


def _has_cuda_plugin() -> bool:
  try:
    return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
  except ModuleNotFoundError:   # no jax_plugins package at all
    return False


@pytest.mark.skipif(_has_cuda_plugin(), reason="the CUDA plugin is installed: --target h100 "
                    "can compile")
def test_hlo_cost_without_the_cuda_plugin_says_what_to_install(tmp_path):
  hc = _load_benchmark("hlo_cost")
  with pytest.raises(SystemExit, match=r"--target h100: no CUDA topology .*Install the CUDA "
                                       r"plugin of this jaxlib"):
    hc.main(["--target", "h100", "--specs", "simple", "--out", str(tmp_path)])
  assert "cuda_compute_capability { major: 9 minor: 0 }" in hc.h100_target_config()


def test_speed_options_ratios_are_against_the_base_row():
  so = _load_benchmark("speed_options")
  options = (so.Option("simple", "simple", {}), so.Option("simple+x", "simple", {"x": 1}, "m"),
             so.Option("softmax_flash", "softmax_flash", {}))
  records = [{"label": label, "length": 64, "status": "ok", "steps_per_sec": sps}
             for label, sps in (("simple", 10.0), ("simple+x", 15.0), ("softmax_flash", 8.0))]
  records.append({"label": "simple+x", "length": 128, "status": "error"})
  so.add_speedups(records, options, {("m", 64): 1.4})
  assert [r["speedup"] for r in records] == [1.0, 1.5, 1.0, None]
  assert [r["modelled_speedup"] for r in records] == [None, 1.4, None, None]


def test_speed_options_quick_run_measures_each_option_and_feeds_torch_step(tmp_path):
  so = _load_benchmark("speed_options")
  payload = so.main(["--quick", "--lengths", "16", "--rounds", "1", "--compile_workers", "1",
                     "--cache_dir", "", "--only", "simple+block_diagonal",
                     "--out", str(tmp_path)])
  rows = {r["label"]: r for r in payload["results"]}
  assert list(rows) == ["simple", "simple+block_diagonal"]
  assert all(r["status"] == "ok" and r["speedup"] > 0 for r in rows.values())
  assert rows["simple+block_diagonal"]["model"]["attention_kwargs"] == {"block_diagonal": True}
  saved = json.loads((tmp_path / "speed_options.json").read_text())
  # torch_step.py --jax_results reads label, length, status and steps_per_sec of each record.
  assert {(r["label"], r["length"], r["status"]) for r in saved["results"]} == {
      (label, 16, "ok") for label in rows} and all(r["steps_per_sec"] > 0
                                                    for r in saved["results"])
  assert "| `simple+block_diagonal` |" in (tmp_path / "speed_options.md").read_text()
  with pytest.raises(SystemExit, match="unknown rows"):
    so.main(["--quick", "--only", "nope", "--out", str(tmp_path)])
