"""Issue 86: a damaged newest checkpoint never blocks a run, tried as a user meets it.

``train.py`` and ``eval.py`` run as child processes on the small ListOps config
(``tests/conftest.py``'s ``SMALL_LISTOPS``). A finished 6-step run, checkpointed every 2
steps, has its newest step (6) damaged the ways a crash or a full disk leaves it: every file
emptied, every file filled with NUL bytes, or only orbax's ``metrics/metrics`` emptied (orbax's
``CheckpointManager`` parses that file when it opens the folder, so before this fix the damage
ended every rerun in a ``JSONDecodeError`` traceback). The rerun must move the step to
``damaged/`` with one warning naming it, resume from step 4 and end with the state an
undamaged run ends with (the CRC-32 of the parameters and optimizer state saved with step 6);
``eval.py`` on the damaged folder must fall back the same way.

A save that hits a file-size limit (``ulimit -f``, as a full disk does) ends with exit 1 and one
line naming the step, the folder and the operating system's cause, with no orbax thread
traceback and no half-written step; a rerun with room ends as an undamaged run.

A Ctrl-C while ``train.py`` is still starting ends with the documented line and status 130.

Two processes that need the same generated ListOps set make it once: the second waits for the
first's lock.

The environment is checked first: a ``JAX_PLATFORMS`` that names no platform this machine can
start, a malformed ``SIMPLETRON_PROGRESS_SECONDS`` and a resume under ``JAX_ENABLE_X64`` each
end with one line naming the variable, and a new workdir is not created.
"""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, SMALL_LISTOPS

RUN = ("--config", "configs/listops/simple.py:tiny", *SMALL_LISTOPS,
       "--config.num_train_steps=6", "--config.eval_frequency=2",
       "--config.checkpoint_every=2", "--config.log_every=2", "--config.warmup=2",
       "--config.max_to_keep=3")


def _python(*args, env=None, timeout=300):
  return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=timeout, check=False, env={**os.environ, **(env or {})})


def _state_crc(workdir, step):
  with open(os.path.join(workdir, "checkpoints", str(step), "meta", "metadata")) as f:
    return json.load(f)["state_crc32"]


def _empty(path):
  open(path, "wb").close()


def _nul(path):
  size = os.path.getsize(path)
  with open(path, "wb") as f:
    f.write(b"\0" * max(size, 1))


def _files(folder):
  return [os.path.join(d, name) for d, _, names in os.walk(folder) for name in names]


DAMAGE = {
    "every_file_empty": lambda step: [_empty(p) for p in _files(step)],
    "every_file_nul": lambda step: [_nul(p) for p in _files(step)],
    "metrics_only_empty": lambda step: _empty(os.path.join(step, "metrics", "metrics")),
}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  """A finished, undamaged run of :data:`RUN`: its workdir."""
  workdir = str(tmp_path_factory.mktemp("straight") / "run")
  proc = _python("train.py", *RUN, "--workdir", workdir)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert sorted(int(s) for s in os.listdir(os.path.join(workdir, "checkpoints"))
                if s.isdigit()) == [2, 4, 6]
  return workdir


@pytest.mark.slow
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_newest_step_is_set_aside_and_the_rerun_ends_as_an_undamaged_run(
    finished, tmp_path, damage):
  workdir = str(tmp_path / "run")
  shutil.copytree(finished, workdir)
  os.remove(os.path.join(workdir, "results.json"))   # as a run killed after its last save
  step6 = os.path.join(workdir, "checkpoints", "6")
  DAMAGE[damage](step6)
  proc = _python("train.py", *RUN, "--workdir", workdir)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  warned = [line for line in proc.stderr.splitlines()
            if "RunWarning: skipping damaged checkpoint" in line]
  assert len(warned) == 1 and step6 in warned[0], proc.stderr[-3000:]
  assert "Resumed from" in proc.stdout + proc.stderr and "step 4" in proc.stdout + proc.stderr
  moved = os.listdir(os.path.join(workdir, "damaged"))
  assert len(moved) == 1 and moved[0].startswith("checkpoints_6_"), moved
  assert _state_crc(workdir, 6) == _state_crc(finished, 6)
  with open(os.path.join(workdir, "results.json")) as f, \
       open(os.path.join(finished, "results.json")) as g:
    ours, straight = json.load(f), json.load(g)
  for key in ("test_accuracy_final", "test_loss_final", "test_accuracy_best_val", "best_step"):
    assert ours[key] == straight[key], key


@pytest.mark.slow
def test_eval_on_a_damaged_newest_step_falls_back_to_the_intact_one(finished, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(finished, workdir)
  DAMAGE["metrics_only_empty"](os.path.join(workdir, "checkpoints", "6"))
  proc = _python("eval.py", "--workdir", workdir, "--which", "latest", "--split", "val")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert "skipping damaged checkpoint" in proc.stderr and "checkpoints/6" in proc.stderr
  with open(os.path.join(workdir, "eval_latest_val.json")) as f:
    assert json.load(f)["step"] == 4


def _assert_one_line(proc, start, *parts):
  assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith(start), proc.stderr[-3000:]
  for part in parts:
    assert part in last, last


@pytest.mark.slow
@pytest.mark.parametrize("platforms", ["bogus", "tpu"])
def test_a_jax_platforms_this_machine_cannot_start_is_one_line(tmp_path, platforms):
  proc = _python("train.py", *RUN, "--workdir", str(tmp_path / "run"),
                 env={"JAX_PLATFORMS": platforms})
  _assert_one_line(proc, f"train.py: JAX_PLATFORMS={platforms!r}: JAX could not start it",
                   "unset JAX_PLATFORMS")
  assert not (tmp_path / "run").exists()


def test_a_malformed_progress_interval_is_one_line_before_anything_is_written(tmp_path):
  proc = _python("train.py", *RUN, "--workdir", str(tmp_path / "run"),
                 env={"SIMPLETRON_PROGRESS_SECONDS": "abc"})
  _assert_one_line(proc, "train.py: SIMPLETRON_PROGRESS_SECONDS='abc' is not a number of "
                   "seconds >= 0")
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_resume_under_jax_enable_x64_names_the_variable(finished, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(finished, workdir)
  os.remove(os.path.join(workdir, "results.json"))
  proc = _python("train.py", *RUN, "--workdir", workdir, env={"JAX_ENABLE_X64": "1"})
  _assert_one_line(proc, "train.py: ", "holds 32-bit arrays, but JAX_ENABLE_X64 is set here",
                   "unset JAX_ENABLE_X64")
  assert _state_crc(workdir, 6) == _state_crc(finished, 6)   # nothing was moved or changed
  assert not os.path.exists(os.path.join(workdir, "damaged"))


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("bash"), reason="ulimit needs a shell")
def test_a_file_size_limit_during_a_save_is_one_line_and_the_rerun_finishes(finished, tmp_path):
  workdir = str(tmp_path / "run")
  command = " ".join([sys.executable, "train.py", *RUN, "--workdir", workdir])
  env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "xla")}   # not the suite's
  proc = subprocess.run(["bash", "-c", f"ulimit -f 64 && exec {command}"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300, check=False)
  step2 = os.path.join(workdir, "checkpoints", "2")
  _assert_one_line(proc, f"train.py: CheckpointError: saving step 2 to {step2} failed: "
                   "File too large")
  for noise in ("_SignalingThread", "Event loop is closed", "Exception ignored"):
    assert noise not in proc.stderr, proc.stderr[-3000:]
  assert not os.listdir(os.path.join(workdir, "checkpoints"))   # no half-written step
  assert not os.path.exists(os.path.join(workdir, "run.lock"))
  proc = _python("train.py", *RUN, "--workdir", workdir)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert _state_crc(workdir, 6) == _state_crc(finished, 6)


_GENERATE = """
import sys
sys.path.insert(0, {root!r})
from simpletron_jax.data.listops.generate import ensure_generated
print(ensure_generated(sys.argv[1], seed=0, num_train=30000, num_val=10, num_test=10,
                       max_length=200, min_length=20, num_workers=1))
"""


@pytest.mark.slow
def test_two_processes_that_need_the_same_listops_set_make_it_once(tmp_path):
  cache = str(tmp_path / "cache")
  code = _GENERATE.format(root=ROOT)
  first = subprocess.Popen([sys.executable, "-c", code, cache], cwd=ROOT, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  deadline = time.monotonic() + 120
  while not list(pathlib.Path(cache).glob("*/*.tmp")) and time.monotonic() < deadline:
    time.sleep(0.05)   # the first is writing its set
  assert first.poll() is None, "the first process ended before the second could start"
  second = subprocess.run([sys.executable, "-c", code, cache], cwd=ROOT, text=True,
                          capture_output=True, timeout=300, check=False)
  out, err = first.communicate(timeout=300)
  assert first.returncode == 0 and second.returncode == 0, (err, second.stderr)
  assert out == second.stdout   # the same folder
  assert "ListOps: waiting for another process that is generating" in second.stderr
  assert "ListOps examples" in err and "ListOps examples" not in second.stderr   # made once


@pytest.mark.parametrize("delay", [0.3, 1.5])
def test_a_ctrl_c_while_train_py_starts_is_the_documented_line(tmp_path, delay):
  """SIGINT while the libraries import (0.3 s) or the config loads (1.5 s): status 130 and
  the one documented line, nothing written."""
  proc = subprocess.Popen([sys.executable, "train.py", *RUN, "--workdir", str(tmp_path / "run")],
                          cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  time.sleep(delay)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 130, err[-3000:]
  assert err.strip().splitlines()[-1] == (
      "train.py: interrupted (SIGINT) before the run could save; the last checkpoint stays: "
      "rerun the same command to continue from it"), err[-3000:]
  assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
