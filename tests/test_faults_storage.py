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

The same limit on ``metrics.jsonl`` or the TensorBoard events file mid-run (``RLIMIT_FSIZE``),
and a workdir made immutable mid-run (``chattr +i``, where root can), end with one line naming
the file or the save, the file cut back to whole records and no lock; each rerun ends as an
uninterrupted run. A run whose every step was set aside stops in one line until
``--start_over``.

A Ctrl-C while ``train.py`` is still starting ends with the documented line and status 130; so
does one inside each final test. A second SIGTERM during a save ends with status 75 and its
line, the last printed, and leaves no half-written step.

Two processes that need the same generated ListOps set make it once: the second waits for the
first's lock.

The environment is checked first: a ``JAX_PLATFORMS`` that names no platform this machine can
start, a malformed ``SIMPLETRON_PROGRESS_SECONDS`` and a resume under ``JAX_ENABLE_X64`` each
end with one line naming the variable, and a new workdir is not created.
"""

import contextlib
import json
import os
import pathlib
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from simpletron_jax.run import metric_logging
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


_MARKING_CONFIG = """
import pathlib
import time


def get_config():
  pathlib.Path({marker!r}).touch()   # the config file runs: the test's signal may come
  time.sleep(120)
"""


@pytest.mark.parametrize("phase", ["imports", "config"])
def test_a_ctrl_c_while_train_py_starts_is_the_documented_line(tmp_path, phase):
  """SIGINT while the libraries import (0.3 s after the start) or while the config file runs
  (a config that marks its start, then sleeps; the signal follows the mark, so no machine is
  too fast for it): status 130 and the one documented line, no workdir made."""
  marker, config = tmp_path / "config_running", tmp_path / "marking_config.py"
  config.write_text(_MARKING_CONFIG.format(marker=str(marker)))
  args = ("--config", str(config)) if phase == "config" else RUN
  with _running("train.py", *args, "--workdir", str(tmp_path / "run")) as (proc, lines):
    if phase == "imports":
      time.sleep(0.3)
    else:
      _wait(marker.exists, proc, lines, seconds=120)
    proc.send_signal(signal.SIGINT)
    status, err = _ended(proc, lines)
  assert status == 130, err[-3000:]
  assert err.strip().splitlines()[-1] == (
      "train.py: interrupted (SIGINT) before the run could save; the last checkpoint stays: "
      "rerun the same command to continue from it"), err[-3000:]
  assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
  assert not (tmp_path / "run").exists()


@contextlib.contextmanager
def _running(*args):
  """A started ``python *args`` child and its stderr lines as they come (a reader thread
  fills the list); the child is killed on leaving if it is still running."""
  proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, text=True,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  lines = []
  threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
  try:
    yield proc, lines
  finally:
    if proc.poll() is None:
      proc.kill()


def _wait(condition, proc, lines, seconds=240):
  deadline = time.monotonic() + seconds
  while not condition():
    assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
    time.sleep(0.001)


def _ended(proc, lines):
  """The child's exit status and stderr, once it has ended."""
  proc.wait(timeout=300)
  time.sleep(0.2)   # the reader thread takes the last lines
  return proc.returncode, "".join(lines)


@pytest.mark.slow
def test_a_second_sigterm_during_a_save_ends_with_the_documented_line(finished, tmp_path):
  """The first SIGTERM asks for a save; the second lands while that save writes (its
  ``<step>.orbax-checkpoint-tmp`` folder exists): status 75 and the documented line, the last
  thing printed (before, orbax's write thread printed a 47-line traceback after it), no
  half-written step and no lock; the rerun ends with the uninterrupted run's state."""
  workdir = tmp_path / "run"
  with _running("train.py", *RUN, "--workdir", str(workdir)) as (proc, lines):
    _wait((workdir / "checkpoints" / "2").is_dir, proc, lines)
    proc.send_signal(signal.SIGTERM)
    _wait(lambda: any(line.startswith("SIGTERM received") for line in list(lines)), proc, lines)
    _wait(lambda: list((workdir / "checkpoints").glob("*.orbax-checkpoint-tmp*")), proc, lines)
    proc.send_signal(signal.SIGTERM)
    status, err = _ended(proc, lines)
  assert status == 75, err[-3000:]
  assert "SIGTERM again: stopping at once, without saving" in err, err[-3000:]
  last = err.strip().splitlines()[-1]
  assert last.startswith("train.py: SIGTERM before the run could save again: its last "
                         "checkpoint, step ") and last.endswith(
                             f"in {workdir / 'checkpoints'}, stays; rerun the same command "
                             "to continue from it"), err[-3000:]
  assert "Traceback" not in err and "cannot schedule new futures" not in err, err[-3000:]
  kept = os.listdir(workdir / "checkpoints")
  assert all(name.isdigit() for name in kept) and "2" in kept, kept   # nothing half-written
  assert not (workdir / "run.lock").exists()
  proc = _python("train.py", *RUN, "--workdir", str(workdir))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert _state_crc(workdir, 6) == _state_crc(finished, 6)


def _fsize_limited(limit, *args):
  """``train.py *args`` under a file-size limit of ``limit`` bytes (``RLIMIT_FSIZE``, as
  ``ulimit -f`` sets it): a write past it fails with ``EFBIG``."""
  return subprocess.run(
      [sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True,
      timeout=300, check=False,
      preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))


def _resumable_at_2(finished, tmp_path):
  """A copy of the finished run as a run killed after its step-2 checkpoint."""
  workdir = tmp_path / "run"
  shutil.copytree(finished, workdir)
  for step in ("4", "6"):
    shutil.rmtree(workdir / "checkpoints" / step)
  os.remove(workdir / "results.json")
  return workdir


@pytest.mark.slow
def test_a_file_size_limit_on_metrics_jsonl_is_one_line_and_the_rerun_finishes(finished,
                                                                                tmp_path):
  """``metrics.jsonl`` reaches the file-size limit at the train record of step 4, before the
  step-4 save: one line naming the file and the cause, the file cut back to its last whole
  record, no lock; the rerun with room ends with the uninterrupted run's state."""
  workdir = _resumable_at_2(finished, tmp_path)
  path = workdir / "metrics.jsonl"
  kept = [r for r in metric_logging.read_records(str(path)) if r["step"] <= 2
          and not (r["step"] == 2 and r["split"] == "info")]
  padding = dict(kept[0], split="padding")   # records before the resumed step are kept
  lines = [json.dumps(r) + "\n" for r in kept + [padding] * 200]
  path.write_text("".join(lines))
  size = path.stat().st_size   # over every other file written before the failure
  # the info record of step 2 fits (about 80 bytes), the train record of step 4 does not
  proc = _fsize_limited(size + 150, *RUN, "--workdir", str(workdir))
  _assert_one_line(proc, f"train.py: WriteError: could not write {path}: File too large "
                   "(errno 27); writing the train record of step 4 failed")
  records = path.read_text()
  assert records.endswith("\n") and records.startswith("".join(lines))
  assert [json.loads(line)["split"] for line in records.splitlines()[len(lines):]] == ["info"]
  assert sorted(os.listdir(workdir / "checkpoints")) == ["2"]
  assert not (workdir / "run.lock").exists()
  proc = _python("train.py", *RUN, "--workdir", str(workdir))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert _state_crc(workdir, 6) == _state_crc(finished, 6)


def _event_ends(path):
  """The byte offset after each record of a TensorBoard events file (TFRecord framing:
  8-byte length, 4-byte CRC, the data, 4-byte CRC)."""
  data, ends, at = pathlib.Path(path).read_bytes(), [], 0
  while at < len(data):
    at += 16 + int.from_bytes(data[at:at + 8], "little")
    ends.append(at)
  return ends


@pytest.mark.slow
def test_a_file_size_limit_on_the_tensorboard_file_is_one_line(finished, tmp_path):
  """The TensorBoard events file reaches the limit at the train record of step 2 (its file
  version, restart marker, hparams and step-0 info records fit, as config.json does): one
  line naming the file and the cause, the file cut back to its last whole event, no lock,
  no checkpoint; the rerun with room ends with the uninterrupted run's state."""
  (events,) = pathlib.Path(finished, "tb").iterdir()
  ends = _event_ends(events)   # file version, restart marker, hparams, info, train, ...
  limit = max(ends[3], os.path.getsize(os.path.join(finished, "config.json"))) + 1
  assert limit < ends[4], (ends, limit)   # the train record of step 2 is the first not to fit
  workdir = tmp_path / "run"
  proc = _fsize_limited(limit, *RUN, "--workdir", str(workdir))
  _assert_one_line(proc, "train.py: WriteError: could not write the TensorBoard events file "
                   f"{workdir / 'tb'}/events.out.tfevents.", "File too large (errno 27)")
  (written,) = (workdir / "tb").iterdir()
  assert _event_ends(written)[-1] == written.stat().st_size == ends[3]   # whole events only
  assert not os.listdir(workdir / "checkpoints") and not (workdir / "run.lock").exists()
  proc = _python("train.py", *RUN, "--workdir", str(workdir))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert _state_crc(workdir, 6) == _state_crc(finished, 6)


def _chattr(flag, *paths):
  subprocess.run(["chattr", flag, *map(str, paths)], check=True, capture_output=True)


def _can_chattr(folder):
  try:
    _chattr("+i", folder)
    _chattr("-i", folder)
    return True
  except (OSError, subprocess.CalledProcessError):
    return False


@pytest.mark.slow
def test_a_workdir_that_loses_write_permission_reports_the_save(finished, tmp_path):
  """The workdir and its checkpoints/ become immutable (``chattr +i``: root too gets
  ``Operation not permitted`` creating or removing a file there) after the step-2 save: the
  step-4 save fails, and that is the line reported, not the lock file the run could not
  remove then (a warning says so); the rerun, once writable, replaces that lock and ends with
  the uninterrupted run's state."""
  if not shutil.which("chattr") or not _can_chattr(tmp_path):
    pytest.skip("chattr +i is not available here (root on a file system that has it)")
  workdir, checkpoints = tmp_path / "run", tmp_path / "run" / "checkpoints"
  try:
    with _running("train.py", *RUN, "--workdir", str(workdir)) as (proc, lines):
      _wait((checkpoints / "2").is_dir, proc, lines)
      _chattr("+i", checkpoints, workdir)
      status, err = _ended(proc, lines)
  finally:
    _chattr("-i", checkpoints, workdir)
  assert status == 1 and "Traceback" not in err, err[-3000:]
  last = err.strip().splitlines()[-1]
  assert last.startswith(f"train.py: CheckpointError: saving step 4 to {checkpoints / '4'} "
                         "failed: Operation not permitted"), err[-3000:]
  assert f"{workdir / 'run.lock'}: could not remove the lock file" in err, err[-3000:]
  assert sorted(os.listdir(checkpoints)) == ["2"]
  proc = _python("train.py", *RUN, "--workdir", str(workdir))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "replacing a stale lock" in proc.stderr
  assert _state_crc(workdir, 6) == _state_crc(finished, 6)


@pytest.mark.slow
def test_a_run_whose_every_step_is_damaged_starts_over_only_when_asked(finished, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(finished, workdir)
  os.remove(workdir / "results.json")
  for step in ("2", "4", "6"):
    DAMAGE["every_file_empty"](str(workdir / "checkpoints" / step))
  proc = _python("train.py", *RUN, "--workdir", str(workdir))
  _assert_one_line(proc, f"train.py: CheckpointError: no intact checkpoint is left in "
                   f"{workdir / 'checkpoints'}: the damaged steps were moved to "
                   f"{workdir / 'damaged'} (checkpoints_2_", "Rerun with --start_over")
  assert not os.listdir(workdir / "checkpoints") and len(os.listdir(workdir / "damaged")) == 3
  proc = _python("train.py", *RUN, "--workdir", str(workdir))   # still refused, not trained
  _assert_one_line(proc, "train.py: CheckpointError: no intact checkpoint is left in ")
  assert not os.listdir(workdir / "checkpoints")
  proc = _python("train.py", *RUN, "--workdir", str(workdir), "--start_over")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert _state_crc(workdir, 6) == _state_crc(finished, 6)
  assert len(os.listdir(workdir / "damaged")) == 3


# A test split of 1,500 batches of 2, so that each final test lasts long enough to be
# interrupted from outside: about two seconds each on 2 busy cores (300 batches lasted under
# 0.5 s, and a signal sent as the best-validation test began once landed after it ended).
LONG_TEST = (*RUN, "--config.data.num_test=3000", "--config.eval_batch_size=2")
_WITH_SIGINT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                "os.execv(sys.executable, [sys.executable] + sys.argv[1:])")


@pytest.fixture(scope="module")
def finished_long_test(tmp_path_factory):
  """A finished run of :data:`LONG_TEST`, whose best-validation step is not its last."""
  workdir = str(tmp_path_factory.mktemp("long_test") / "run")
  proc = _python("train.py", *LONG_TEST, "--workdir", workdir)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(os.path.join(workdir, "results.json")) as f:
    assert json.load(f)["best_step"] != 6   # so the best-validation test is a test of its own
  return workdir


@pytest.mark.slow
@pytest.mark.parametrize("which", ["test_final", "test"])
def test_a_ctrl_c_inside_each_final_test_is_the_documented_line(finished_long_test, tmp_path,
                                                                which):
  """Ctrl-C during the test of the final parameters (once the training bar has closed) or of
  the best-validation checkpoint (once the final test's record is written): status 130 and
  the documented line, nothing recorded for the interrupted test, no results.json, no lock;
  the rerun ends as the uninterrupted run."""
  workdir = tmp_path / "run"
  metrics = workdir / "metrics.jsonl"
  # A process started in the background may inherit SIGINT ignored: the child puts the
  # default back and becomes train.py, as a terminal's Ctrl-C would find it.
  with _running("-c", _WITH_SIGINT, "train.py", *LONG_TEST, "--workdir", str(workdir)) as (
      proc, lines):
    if which == "test_final":
      _wait(lambda: any(line.startswith("train: 6/6") for line in list(lines)), proc, lines)
    else:
      _wait(lambda: metrics.exists() and '"split": "test_final"' in metrics.read_text(), proc,
            lines)
    proc.send_signal(signal.SIGINT)
    status, err = _ended(proc, lines)
  assert status == 130, err[-3000:]
  assert err.strip().splitlines()[-1] == (
      "train.py: interrupted (SIGINT) before the run could save; the last checkpoint stays: "
      "rerun the same command to continue from it"), err[-3000:]
  assert "Traceback" not in err, err[-3000:]
  assert f'"split": "{which}"' not in metrics.read_text()
  assert not (workdir / "results.json").exists() and not (workdir / "run.lock").exists()
  proc = _python("train.py", *LONG_TEST, "--workdir", str(workdir))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert _state_crc(workdir, 6) == _state_crc(finished_long_test, 6)
  with open(workdir / "results.json") as f, \
       open(os.path.join(finished_long_test, "results.json")) as g:
    ours, straight = json.load(f), json.load(g)
  for key in ("test_accuracy_final", "test_loss_final", "test_accuracy_best_val",
              "test_loss_best_val", "best_step", "final_step"):
    assert ours[key] == straight[key], key
