"""The PyTorch reference model of benchmarks/torch_step.py computes the JAX model's function.

Skipped where PyTorch is not installed; `.ci/run` installs it (the CPU build).
"""

import json
import os
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))

import speed_memory  # noqa: E402

from simpletron_jax.model import encoders  # noqa: E402
from simpletron_jax.train import steps  # noqa: E402
from tests.module_support import init_variables  # noqa: E402

TINY = {"emb_dim": 16, "num_heads": 2, "qkv_dim": 16, "mlp_dim": 32, "num_layers": 2}
LENGTH = 12


# PyTorch (and the benchmarks that import it) are imported by these fixtures, when a test runs,
# not at collection: that import costs about 4 s in every process that collects the tests.
@pytest.fixture(scope="module")
def torch():
  """The torch module; every test of this file is skipped where PyTorch is not installed."""
  return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def torch_step(torch):  # pylint: disable=redefined-outer-name,unused-argument
  import torch_step as module  # pylint: disable=import-outside-toplevel
  return module


@pytest.fixture(scope="module")
def jax_vs_torch(torch):  # pylint: disable=redefined-outer-name,unused-argument
  import jax_vs_torch as module  # pylint: disable=import-outside-toplevel
  return module


def _jax_model(kind: str):
  setup = speed_memory.variant_setup(kind, LENGTH)
  config = speed_memory.lra_text_config(LENGTH, setup.attention, setup.attention_kwargs, 3,
                                        "float32", TINY)
  return encoders.build_classifier(config.model, vocab_size=speed_memory.BYTE_VOCAB,
                                   num_classes=speed_memory.NUM_CLASSES)


def test_the_torch_model_has_the_benchmark_model_sizes(torch_step):
  model = speed_memory.lra_text_config(1024, "simple", {}, 32, "bfloat16").model
  assert {k: model[k] for k in torch_step.MODEL} == torch_step.MODEL


@pytest.mark.parametrize("kind", ["softmax", "simple"])
def test_torch_logits_and_gradients_equal_jax_with_padding(kind, torch, torch_step):
  """Same parameters, a padded batch, no dropout: the logits, the loss and the gradient of
  every parameter agree in float32."""
  model = _jax_model(kind)
  rng = np.random.default_rng(1)
  lengths = np.array([LENGTH, 7, 3])
  tokens = rng.integers(1, speed_memory.BYTE_VOCAB, (3, LENGTH)).astype(np.int32)
  tokens[np.arange(LENGTH)[None, :] >= lengths[:, None]] = 0
  mask = tokens > 0
  targets = np.array([0, 1, 1], np.int32)
  params = init_variables(model, jnp.asarray(tokens), seed=0)["params"]
  # Move every parameter off its initial value (zero CLS, 1e-6 biases, unit LayerNorm scales),
  # so a parameter loaded into the wrong place cannot go unnoticed; on the host, not op by op.
  params = jax.tree_util.tree_map(
      lambda leaf: np.asarray(leaf) + rng.normal(0.0, 0.3, leaf.shape).astype(np.float32),
      params)

  def loss_of(p):
    logits = model.apply({"params": p}, jnp.asarray(tokens), jnp.asarray(mask),
                         deterministic=True)
    metrics = steps.metrics_of(logits, jnp.asarray(targets), jnp.ones(3))
    return metrics.loss.total / metrics.loss.count, logits

  (loss, logits), grads = jax.jit(jax.value_and_grad(loss_of, has_aux=True))(params)

  reference = torch_step.TextClassifier(kind, speed_memory.BYTE_VOCAB,
                                        speed_memory.NUM_CLASSES, LENGTH, dropout_rate=0.1,
                                        **TINY)
  torch_step.load_flax_params(reference, params)
  reference.eval()
  torch_logits = reference(torch.from_numpy(tokens.astype(np.int64)), torch.from_numpy(mask))
  torch_loss = torch.nn.functional.cross_entropy(torch_logits,
                                                 torch.from_numpy(targets.astype(np.int64)))
  torch_loss.backward()
  chex.assert_shape(torch_logits, (3, speed_memory.NUM_CLASSES))
  np.testing.assert_allclose(torch_logits.detach().numpy(), np.asarray(logits), rtol=1e-4,
                             atol=1e-5)
  np.testing.assert_allclose(torch_loss.item(), float(loss), rtol=1e-5)

  # The JAX gradients, loaded into a second copy through the same mapping, against .grad.
  expected = torch_step.TextClassifier(kind, speed_memory.BYTE_VOCAB, speed_memory.NUM_CLASSES,
                                       LENGTH, **TINY)
  torch_step.load_flax_params(expected, grads)
  got = dict(reference.named_parameters())
  for name, value in expected.named_parameters():
    assert got[name].grad is not None, name
    np.testing.assert_allclose(got[name].grad.numpy(), value.detach().numpy(), rtol=1e-3,
                               atol=1e-5, err_msg=name)


def test_a_wrong_parameter_tree_is_refused(torch_step):
  reference = torch_step.TextClassifier("simple", speed_memory.BYTE_VOCAB, 2, LENGTH, **TINY)
  params = jax.eval_shape(_jax_model("simple").init, jax.random.PRNGKey(0),
                          jnp.ones((1, LENGTH), jnp.int32))["params"]
  wide = jax.tree_util.tree_map(lambda x: np.zeros(x.shape, x.dtype), params)
  wide["head_logits"]["kernel"] = np.zeros((TINY["mlp_dim"], 3), np.float32)
  with pytest.raises(ValueError, match="does not fit"):
    torch_step.load_flax_params(reference, wide)


def test_the_benchmark_writes_rows_and_ratios_against_jax(tmp_path, torch_step):
  """Eager rows at one length on CPU; the JAX row read from a speed_memory payload is divided
  by the fastest PyTorch row of each attention."""
  jax_path = tmp_path / "speed_memory.json"
  jax_path.write_text(json.dumps({"results": [
      {"label": "simple", "length": 16, "status": "ok", "steps_per_sec": 3.0},
      {"label": "softmax_flash", "length": 16, "status": "OOM"}]}))
  payload = torch_step.main(["--lengths", "16", "--batch", "2", "--modes", "eager",
                             "--steps", "2", "--rounds", "1", "--dtype", "float32",
                             "--jax_results", str(jax_path), "--out", str(tmp_path)])
  records = {r["label"]: r for r in payload["records"]}
  assert set(records) == {"torch_softmax_eager", "torch_simple_eager"}
  for record in records.values():
    assert record["status"] == "ok", record
    assert record["steps_per_run"] == 2 and len(record["step_times_s"]) == 1
    assert np.isfinite(record["final_loss"])
  text = (tmp_path / "torch_step.md").read_text()
  softmax_ratio = 3.0 / records["torch_softmax_eager"]["steps_per_sec"]
  simple_ratio = 3.0 / records["torch_simple_eager"]["steps_per_sec"]
  row = next(line for line in text.splitlines() if line.startswith("| `simple` |"))
  cells = [cell.strip() for cell in row.strip("| ").split("|")]
  assert cells[1:] == ["3", f"{softmax_ratio:.2f}x", f"{simple_ratio:.2f}x"]
  assert "softmax_flash" not in text   # no ok cell, no row
  assert json.loads((tmp_path / "torch_step.json").read_text())["records"] == payload["records"]


def test_the_report_gives_gpu_memory_and_the_failed_cells(torch_step):
  """A GPU payload (peak memory recorded) with an OOM cell and the row it stopped."""
  def cell(label, length, status, **fields):
    kind = label.split("_")[1]
    return {"label": label, "attention": kind, "length": length, "status": status,
            "reason": "CUDA out of memory" if status == "OOM" else "", **fields}
  payload = {"command": "python benchmarks/torch_step.py", "created": "2026-11-23",
             "machine": {"device_type": "cuda", "device_name": "GPU", "torch": "2.11.0",
                         "cuda": "13.0", "cudnn": 91000},
             "settings": {"lengths": [1024, 4096], "dtype": "bfloat16", "batch": 32,
                          "rounds": 3, "steps": 10, "run_seconds": 2.0,
                          "attention_dropout": 0.0, "jax_results": None},
             "records": [cell("torch_softmax_eager", 1024, "ok", steps_per_sec=80.0,
                              peak_bytes=2 * torch_step.GIB),
                         cell("torch_softmax_eager", 4096, "OOM")],
             "jax_results": None}
  lines = torch_step.markdown_report(payload).splitlines()
  assert "| row | steps/s 1024 | steps/s 4096 | peak GiB 1024 | peak GiB 4096 | " in lines
  assert "| `torch_softmax_eager` | 80 | OOM | 2.00 |  | " in lines
  assert "- `torch_softmax_eager` at 4096: OOM, CUDA out of memory" in lines


@pytest.mark.parametrize("flags", [["--dropout", "1.0"], ["--attention_dropout", "-0.1"],
                                   ["--steps", "0"]])
def test_bad_flags_are_refused(flags, capsys, torch_step):
  with pytest.raises(SystemExit):
    torch_step.parse_args(flags)
  assert flags[0] in capsys.readouterr().err


def test_a_non_finite_loss_is_an_error_and_a_foreign_json_is_refused(tmp_path, monkeypatch, torch,
                                                                      torch_step):
  monkeypatch.setattr(torch_step, "make_step",
                      lambda *args: lambda tokens, targets: torch.tensor(float("nan")))
  record = torch_step.measure("simple", "eager", 8, 2, "float32", 1, 1, torch.device("cpu"),
                              model_sizes=TINY)
  assert record["status"] == "error" and "nan" in record["reason"], record
  foreign = tmp_path / "other.json"
  foreign.write_text(json.dumps({"records": []}))
  with pytest.raises(ValueError, match="not a speed_memory.json"):
    torch_step.main(["--jax_results", str(foreign), "--out", str(tmp_path)])


def test_the_interleaved_benchmark_times_both_frameworks_in_turn(tmp_path, monkeypatch, torch,
                                                                  torch_step, jax_vs_torch):
  """benchmarks/jax_vs_torch.py: one JAX row against its PyTorch model, rounds interleaved;
  the PyTorch model starts from the JAX parameters, and a failing cell is a record."""
  jvt = jax_vs_torch
  sets = [f"{k}={v}" for k, v in TINY.items()]
  payload = jvt.main(["--variants", "simple", "--lengths", "16", "--rounds", "3",
                      "--set", *sets, "--out", str(tmp_path)])
  (record,) = payload["results"]
  assert record["status"] == "ok", record
  assert record["torch_label"] == "torch_simple_eager"
  assert len(record["jax_s"]) == len(record["torch_s"]) == 3
  assert record["jax_speed_vs_torch"] == pytest.approx(
      np.median(record["torch_s"]) / np.median(record["jax_s"]))
  assert np.isfinite(record["jax_final_loss"]) and np.isfinite(record["torch_final_loss"])
  text = (tmp_path / "jax_vs_torch.md").read_text()
  assert f"| `simple` | `torch_simple_eager` | 16 | {record['jax_median_s']:.4g} |" in text
  assert json.loads((tmp_path / "jax_vs_torch.json").read_text())["results"] == [record]
  # A config the JAX side refuses is recorded, not raised.
  failed = jvt.measure_pair("simple", 16, 2, "float32", 1, 1, torch.device("cpu"),
                            overrides={**TINY, "num_heads": 3})
  assert failed["status"] == "error" and "num_heads=3" in failed["reason"]
  with pytest.raises(SystemExit, match="jax_vs_torch: no cell ran"):
    jvt.main(["--variants", "simple", "--lengths", "16", "--rounds", "1",
              "--set", *sets, "num_heads=3", "--out", str(tmp_path / "none")])
  assert (tmp_path / "none" / "jax_vs_torch.md").exists()   # the reasons are written
  # A non-finite loss is an error, not a timing.
  monkeypatch.setattr(torch_step, "make_step",
                      lambda *a, **k: (lambda tokens, targets: torch.tensor(float("nan"))))
  nan = jvt.measure_pair("simple", 16, 2, "float32", 1, 1, torch.device("cpu"), overrides=TINY)
  assert nan["status"] == "error" and nan["reason"] == "non-finite torch_final_loss"
  with pytest.raises(ValueError, match="unknown variant 'nope'"):
    jvt.main(["--variants", "nope", "--out", str(tmp_path)])
