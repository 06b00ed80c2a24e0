"""Multi-host training with two processes on one machine (``jax.distributed`` over a
localhost coordinator, gloo CPU collectives, one CPU device per process).

The two-process runs (tests/multihost_worker.py) must match one process with two
devices: parameters, each host's rows of every batch, validation metrics. Only process 0
writes the logs; a run killed on both processes resumes to the parameters of an
uninterrupted one; a host with another config is refused at start-up; an unreachable
coordinator is reported within its time-out. Deselect the process-spawning tests with
``-m "not multihost"``.
"""

import json
import os
import re
import socket
import subprocess
import sys

import chex
import jax
import numpy as np
import pytest

from simpletron_jax.data import tasks
from simpletron_jax.data.common import RaggedExamples
from simpletron_jax.runtime import distributed
from simpletron_jax.train import checkpoints, run_config, train_state
from tests import multihost_worker as worker
from tests.conftest import ROOT

PAIR_TIMEOUT_S = 300
# One CPU device per process and conftest's compile flags, which make XLA's compiles cheap
# (most of these runs) and the one-process and two-process programs alike.
WORKER_XLA_FLAGS = ("--xla_force_host_platform_device_count=1 "
                    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                    "--xla_cpu_use_fusion_emitters=false")
TRAIN, STEPS, HALF = "train", 6, 4  # worker_config: 6 steps of 8 examples, 4 per host


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run_pair(tmp_path, workdir, name, *extra, seeds=(0, 0)):
  """Runs the two worker processes; returns (exit codes, their records or None, logs).

  ``workdir`` is shared, or a pair of folders (one per process)."""
  workdirs = workdir if isinstance(workdir, (list, tuple)) else (workdir, workdir)
  port = _free_port()
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=WORKER_XLA_FLAGS)
  outs = [tmp_path / f"{name}_{i}.json" for i in range(2)]
  procs = [subprocess.Popen(
      [sys.executable, worker.__file__, f"--process_id={i}", f"--port={port}",
       f"--workdir={workdirs[i]}", f"--out={outs[i]}", f"--seed={seeds[i]}", *extra],
      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  try:
    logs = [p.communicate(timeout=PAIR_TIMEOUT_S)[0] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  records = [json.loads(o.read_text()) if o.exists() else None for o in outs]
  return [p.returncode for p in procs], records, logs


def _check_ok(codes, logs):
  assert codes == [0, 0], "\n\n".join(log[-3000:] for log in logs)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
  """An uninterrupted two-process run: (workdir, [record of process 0, of process 1])."""
  tmp = tmp_path_factory.mktemp("straight")
  codes, records, logs = _run_pair(tmp, tmp / "run", "straight")
  _check_ok(codes, logs)
  return tmp / "run", records


@pytest.fixture(scope="module")
def single(tmp_path_factory):
  """The same run in this process, on its 2 devices, with the same recording (trained once
  per process: test_faults_lifecycle.py compares against it too)."""
  return worker.single_process_run(str(tmp_path_factory.mktemp("single")))


def _final_params(workdir):
  config, data = worker.worker_config(), worker.presence_data()
  run = run_config.RunConfig.from_config_dict(config)
  state = train_state.create_train_state(run.train, train_state.build_model(run, data),
                                         jax.random.PRNGKey(1), config.model.max_length)
  manager = checkpoints.checkpoint_manager(os.path.join(workdir, "checkpoints"), None)
  state, _, step = checkpoints.restore_checkpoint(manager, state)
  assert step == STEPS
  return state.params


def _loads(record, split):
  return [idx for name, idx in record["loads"] if name == split]


@pytest.mark.multihost
@pytest.mark.slow
def test_two_processes_train_like_one_process_with_two_devices(straight, single):
  workdir, (rec0, rec1) = straight
  assert [(r["process_index"], r["process_count"], r["local_device_count"])
          for r in (rec0, rec1)] == [(0, 2, 1), (1, 2, 1)]
  chex.assert_trees_all_close(_final_params(workdir), _final_params(single[0]),
                              rtol=1e-5, atol=1e-6)
  # Validations (steps 3 and 6) and the test: the same numbers on both hosts, and those
  # of one process; majority_rate counts both hosts' rows.
  assert len(rec0["evals"]) == 3 and rec0["evals"] == rec1["evals"]
  for multi, one in zip(rec0["evals"], single[1]["evals"], strict=True):
    assert multi["count"] == one["count"] == 200
    assert multi["majority_rate"] == one["majority_rate"]
    np.testing.assert_allclose([multi["accuracy"], multi["loss"]],
                               [one["accuracy"], one["loss"]], rtol=1e-5)


@pytest.mark.multihost
@pytest.mark.slow
def test_two_processes_under_jit_train_like_pmap(single, tmp_path):
  """config.parallelism="jit": global arrays over a mesh of both processes' devices, each
  process supplying its rows, give pmap's parameters and evaluations."""
  codes, (rec0, rec1), logs = _run_pair(tmp_path, tmp_path / "run", "jit", "--parallelism=jit")
  _check_ok(codes, logs)
  chex.assert_trees_all_close(_final_params(tmp_path / "run"), _final_params(single[0]),
                              rtol=1e-5, atol=1e-6)
  assert len(rec0["evals"]) == 3 and rec0["evals"] == rec1["evals"]
  for multi, one in zip(rec0["evals"], single[1]["evals"], strict=True):
    assert multi["count"] == one["count"] == 200
    np.testing.assert_allclose([multi["accuracy"], multi["loss"]],
                               [one["accuracy"], one["loss"]], rtol=1e-5)


@pytest.mark.multihost
@pytest.mark.slow
def test_each_process_loads_only_its_rows_of_each_global_batch(straight, single):
  (rec0, rec1), one = straight[1], single[1]
  for split, steps in ((TRAIN, STEPS), ("val", 1), ("test", 1)):
    glob, first, second = _loads(one, split), _loads(rec0, split), _loads(rec1, split)
    assert min(len(glob), len(first), len(second)) >= steps, split
    for g, a, b in zip(glob[:steps], first, second):
      assert a == g[:len(g) // 2] and b == g[len(g) // 2:], split
      assert not set(a) & set(b)
  assert all(len(idx) == HALF for idx in _loads(rec0, TRAIN))


@pytest.mark.multihost
@pytest.mark.slow
def test_only_process_0_writes_metrics_tensorboard_and_results(straight):
  workdir, (rec0, rec1) = straight
  logs = ("metrics.jsonl", "results.json", "config.json")
  # JSON files are written aside (``.tmp``) and renamed over the file (atomic_io.write_*_atomic).
  assert set(logs) <= {w.removesuffix(".tmp") for w in rec0["writes"]}
  assert not [w for w in rec1["writes"] if w.removesuffix(".tmp") in logs or w.startswith("tb")], rec1["writes"]
  assert len(os.listdir(workdir / "tb")) == 1, "one TensorBoard event file: process 0's"
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  keys = [(r["step"], r["split"]) for r in records]
  assert len(keys) == len(set(keys)) and (STEPS, "val") in keys
  results = json.loads((workdir / "results.json").read_text())
  assert results["num_devices"] == 2
  _assert_same_record(results, rec0["results"])


def _assert_same_record(got, want, where="results"):
  """``got`` equals ``want``: floats within a relative 1e-6 (a JSON round trip), everything
  else (keys, lengths, strings, integers, booleans, None) exactly, at any depth."""
  if isinstance(want, float) or isinstance(got, float):
    assert isinstance(got, (int, float)) and not isinstance(got, bool), (where, got, want)
    assert got == pytest.approx(want, rel=1e-6, nan_ok=True), (where, got, want)
  elif isinstance(want, dict):
    assert isinstance(got, dict) and got.keys() == want.keys(), (where, sorted(got), sorted(want))
    for key in want:
      _assert_same_record(got[key], want[key], f"{where}.{key}")
  elif isinstance(want, list):
    assert isinstance(got, list) and len(got) == len(want), (where, got, want)
    for i, (a, b) in enumerate(zip(got, want)):
      _assert_same_record(a, b, f"{where}[{i}]")
  else:
    assert got == want and type(got) is type(want), (where, got, want)


@pytest.mark.multihost
@pytest.mark.slow
def test_killed_processes_resume_to_the_uninterrupted_parameters(straight, single, tmp_path):
  workdir = tmp_path / "run"
  codes, records, logs = _run_pair(tmp_path, workdir, "killed", "--kill_at=4")
  assert codes[0] == worker.KILLED_EXIT_CODE and codes[1] != 0, logs
  ckpt_dir = workdir / "checkpoints"
  # Kept: the newest two saves (the step-3 validation's best, the step-4 checkpoint).
  assert sorted(os.listdir(ckpt_dir)) == ["3", "4"], "only committed checkpoints are visible"
  assert all((ckpt_dir / s / "commit_success.txt").exists() for s in ("3", "4"))
  # A save cut short leaves orbax's temporary folder, which is never read as a step.
  (ckpt_dir / "6.orbax-checkpoint-tmp" / "state").mkdir(parents=True)
  # A host that does not see the shared workdir would start over: refused.
  codes, _, logs = _run_pair(tmp_path, [workdir, tmp_path / "local1"], "local")
  assert codes[0] != 0 and codes[1] != 0
  assert all("see other checkpoints in" in log for log in logs), logs
  codes, records, logs = _run_pair(tmp_path, workdir, "resumed")
  _check_ok(codes, logs)
  glob = _loads(single[1], TRAIN)
  assert _loads(records[0], TRAIN)[0] == glob[4][:HALF], "resume at the step-4 checkpoint"
  assert _loads(records[1], TRAIN)[0] == glob[4][HALF:]
  chex.assert_trees_all_equal(_final_params(workdir), _final_params(straight[0]))
  assert records[0]["evals"][-1] == straight[1][0]["evals"][-1]


@pytest.mark.multihost
@pytest.mark.slow
def test_a_host_with_another_config_is_refused_at_start_up(tmp_path):
  codes, _, logs = _run_pair(tmp_path, tmp_path / "run", "mismatch", seeds=(0, 1))
  assert codes[0] != 0 and codes[1] != 0
  for log in logs:
    assert re.search(r"process\(es\) \[1\] see a different config from process 0", log), log
  assert not (tmp_path / "run" / "checkpoints").exists() or not os.listdir(
      tmp_path / "run" / "checkpoints")


@pytest.mark.multihost
@pytest.mark.slow
def test_train_py_reports_an_unreachable_coordinator(tmp_path):
  proc = subprocess.run(
      [sys.executable, "train.py", "--config", "configs/listops/simple.py:tiny",
       "--workdir", str(tmp_path / "run"), f"--coordinator_address=127.0.0.1:{_free_port()}",
       "--num_processes=2", "--process_id=1", "--distributed_timeout=1"],
      cwd=ROOT, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=WORKER_XLA_FLAGS))
  assert proc.returncode != 0
  assert "could not reach the jax.distributed coordinator at 127.0.0.1:" in proc.stderr, \
      proc.stderr[-2000:]


def test_waiting_for_an_absent_coordinator_times_out():
  address = f"127.0.0.1:{_free_port()}"
  with pytest.raises(distributed.CoordinatorTimeoutError, match=f"at {address} within 0.5 s"):
    distributed.wait_for_coordinator(address, 0.5)
  with pytest.raises(ValueError, match="must be host:port"):
    distributed.wait_for_coordinator("localhost", 0.5)


def test_fingerprints_see_data_and_config_but_not_host_paths(presence_task):
  base = distributed.data_fingerprint(presence_task)
  again = tasks.TaskData(**{**presence_task.__dict__, "source": "/another/host/path"})
  assert distributed.data_fingerprint(again) == base
  tokens = presence_task.test.tokens.copy()
  tokens[0] = tokens[0] % 15 + 1  # another real token id
  changed = RaggedExamples(tokens, presence_task.test.offsets, presence_task.test.labels)
  assert distributed.data_fingerprint(
      tasks.TaskData(**{**presence_task.__dict__, "test": changed})) != base
  config = worker.worker_config()
  moved = worker.worker_config()
  moved.data.data_dir = "/mnt/host1/lra_release"
  assert distributed.config_fingerprint(moved) == distributed.config_fingerprint(config)
  config.model.num_layers = 2
  assert distributed.config_fingerprint(moved) != distributed.config_fingerprint(config)


def test_batch_must_split_over_the_devices_of_all_hosts():
  config = worker.worker_config()
  config.batch_size = 6
  with pytest.raises(ValueError, match=re.escape(
      "batch_size=6 must be divisible by grad_accum_steps=1 times the 4 device(s) of all "
      "hosts (2 host(s) x 2 local device(s))")):
    run_config.RunConfig.from_config_dict(config, 4, 2)
