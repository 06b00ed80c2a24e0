"""The TPU compile check (issue 37): ``train.py``'s steps compiled for TPU slices by libtpu on
this CPU host (:mod:`simpletron_jax.tools.tpu_aot`, ``scripts/tpu_check.py``).

libtpu is in the ``test`` extra, so these run in CI: they fail when a step stops compiling for
a TPU, or the memory figures stop adding up.
"""

import os
import subprocess
import sys

import pytest

from configs.listops import simple, transformer
from simpletron_jax.tools import tpu_aot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tiny_one_block():
  """The tiny ListOps ``simple`` config with one encoder block: the blocks are alike, and
  each one more only adds to libtpu's compile time (2 blocks: 41 CPU-s for the fixture
  against 26). Dropout off and 64 positions (not 200): the dropout masks' random bits were
  three quarters of libtpu's train-step compile (31 s against 8 s on a loaded 2-core host),
  and these tests check that the steps compile and that their memory figures add up."""
  config = simple.get_config("tiny")
  config.model.num_layers = 1
  config.model.max_length = 64
  config.model.dropout_rate = config.model.attention_dropout_rate = 0.0
  return config


@pytest.fixture(scope="module")
def tiny_reports():
  """The tiny ListOps ``simple`` train and eval steps (one block) compiled for v4-8 and
  v5e-8."""
  config = _tiny_one_block()
  return {name: tpu_aot.compile_report(config, name) for name in ("v4-8", "v5e-8")}


def test_slices_have_the_chips_and_hbm_of_their_name():
  v4, v5e = tpu_aot.slice_devices("v4-8"), tpu_aot.slice_devices("v5e-8")
  assert (len(v4), v4[0].platform, v4[0].device_kind) == (4, "tpu", "TPU v4")   # megacore
  assert (len(v5e), v5e[0].device_kind) == (8, "TPU v5 lite")
  assert {d.process_index for d in v5e} == {0}        # one host, as a v5e-8 VM
  assert len({d.process_index for d in tpu_aot.slice_devices("v5e-16")}) == 4
  assert tpu_aot.hbm_bytes(v4[0]) == 32 << 30 and tpu_aot.hbm_bytes(v5e[0]) == 16 << 30
  with pytest.raises(tpu_aot.TpuCheckError, match="unknown TPU slice 'v9-8'"):
    tpu_aot.slice_devices("v9-8")


@pytest.mark.slow
def test_tiny_train_and_eval_steps_compile_for_v4_and_v5e(tiny_reports):
  config = _tiny_one_block()
  for name, report in tiny_reports.items():
    n = report["devices"]
    assert report["ok"], report
    train, evals = report["compiles"]
    assert (train["step"], evals["step"]) == ("train", "eval")
    assert train["width"] == evals["width"] == config.model.max_length
    assert train["rows_per_device"] * n == config.batch_size
    # The state is an argument, donated, and an output of the train step; the eval step
    # takes the params only, so its arguments are smaller and nothing is aliased.
    assert train["alias_bytes"] > 0 and evals["alias_bytes"] == 0
    assert train["argument_bytes"] >= train["alias_bytes"] > evals["argument_bytes"] > 0
    assert train["peak_bytes"] == (train["argument_bytes"] + train["output_bytes"]
                                   - train["alias_bytes"] + train["temp_bytes"]
                                   + train["generated_code_bytes"])
    assert report["peak_bytes"] == train["peak_bytes"] < report["hbm_bytes"]
    # Forward + backward is at least twice the forward's FLOPs.
    assert train["flops"] > 2 * evals["flops"] > 0
    assert name in tpu_aot.summary_line(report) and "OK" in tpu_aot.summary_line(report)


@pytest.mark.slow
def test_a_step_that_does_not_fit_is_reported_as_such():
  # The tiny model, made to need more than a v5e chip's 16 GiB: a 256K-token softmax layer.
  config = transformer.get_config("tiny")
  config.model.max_length = 1 << 18
  config.model.num_layers = 1
  report = tpu_aot.compile_report(config, "v5e-8", steps=("eval",))
  assert not report["ok"] and not report["compiles"][0]["fits"]
  # The TPU compiler itself refuses it, and the line says so.
  assert "exceeds available HBM" in report["compiles"][0]["error"]
  assert tpu_aot.summary_line(report).startswith("FAIL: listops/softmax float32 on v5e-8: the "
                                                 "eval step at width 262144 does not compile")


@pytest.mark.slow
def test_cli_exit_status_and_one_line_errors(tmp_path):
  env = {**os.environ, "PYTHONPATH": ROOT}
  def run(*args):
    return subprocess.run([sys.executable, "scripts/tpu_check.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
  # One block at 64 positions (libtpu compiles less), set through the config flags.
  ok = run("--config", "configs/listops/simple.py:tiny", "--config.model.num_layers=1",
           "--config.model.max_length=64", "--slice", "v5e-8", "--steps", "eval",
           "--json", str(tmp_path / "r.json"))
  assert ok.returncode == 0, ok.stderr[-2000:]
  assert "OK: listops/simple float32 on v5e-8" in ok.stdout
  assert (tmp_path / "r.json").exists()
  bad = run("--config", "configs/listops/simple.py:tiny", "--slice", "v9-8")
  assert bad.returncode == 2 and "tpu_check.py: unknown TPU slice 'v9-8'" in bad.stderr
  assert "Traceback" not in bad.stderr


def test_a_chip_whose_hbm_is_unknown_gets_no_memory_verdict():
  report = {"task": "listops", "attention": "simple", "dtype": "float32", "slice": "v3:2x2",
            "hbm_bytes": None, "peak_bytes": 1 << 30, "ok": True, "device_kind": "TPU v3",
            "compiles": []}
  line = tpu_aot.summary_line(report)
  assert "fits" not in line and "'TPU v3' chip is unknown" in line and "1.00 GiB" in line
