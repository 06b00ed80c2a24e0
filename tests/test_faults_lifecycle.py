"""Preemption, full disks and results.json (issue 27, deliverables 1, 2 and 4).

* SIGTERM or SIGINT during training: the run finishes its step, saves it, writes its
  metrics, releases the lock and raises ``preemption.PreemptedError`` (``train.py`` exits 75
  with "preempted at step N; rerun the same command to continue"); the rerun ends
  bit-identical to an uninterrupted run. On two hosts, both stop at the same step (JAX's
  preemption sync point).
* A disk that fills: every write of the run either succeeds or stops the run at once with a
  one-line error naming the file (``errors.WriteError``; ``CheckpointError`` for orbax);
  nothing hangs (a SIGALRM deadline turns a hang into a failure) and no good file is
  replaced by a broken one. The disk is a tmpfs of a few MiB mounted for the test (the tests
  run as root here); where ``mount`` is refused, :class:`SmallDisk` simulates it by making
  Python's writes under the folder and orbax's saves fail with ``ENOSPC``.
* ``results.json`` records ``complete``, ``final_step`` and ``config_fingerprint``;
  ``scripts/seeds.py`` and ``scripts/compare.py`` count only finished, matching runs and
  say what they left out.
"""

import builtins
import contextlib
import errno
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import warnings

import chex
import orbax.checkpoint as ocp
import pytest

from simpletron_jax.train import trainer
from simpletron_jax.run import run_folder, run_guard
from simpletron_jax.runtime import atomic_io, errors
from simpletron_jax.train import checkpoints
from simpletron_jax.run import metric_logging, preemption, run_record
from simpletron_jax.run.metric_logging import MetricLogger, read_records
from tests import multihost_worker as worker
from tests.conftest import ROOT, SMALL_LISTOPS
from tests.test_faults import _params, fault_config

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import compare  # noqa: E402  pylint: disable=wrong-import-position
import seeds  # noqa: E402  pylint: disable=wrong-import-position


@contextlib.contextmanager
def deadline(seconds: int):
  """Fails (TimeoutError) instead of hanging when the block runs longer than ``seconds``."""
  def fire(signum, frame):
    raise TimeoutError(f"still running after {seconds} s: a write hangs")
  previous = signal.signal(signal.SIGALRM, fire)
  signal.alarm(seconds)
  try:
    yield
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _restored_steps(workdir):
  return checkpoints.checkpoint_manager(os.path.join(workdir, "checkpoints"), None).all_steps()


@pytest.fixture(scope="module")
def straight(presence_task, tmp_path_factory):
  """An uninterrupted :func:`fault_config` run: (workdir, results)."""
  workdir = str(tmp_path_factory.mktemp("straight"))
  return workdir, trainer.train_and_evaluate(fault_config(), workdir, data=presence_task)


# ----------------------------------------------------------------------------
# Preemption.


@pytest.fixture
def python_sigint():
  """A process started in the background (nohup, some CI runners) inherits SIGINT ignored;
  the test starts from Python's own handler, and the inherited one is put back after."""
  inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
  yield
  signal.signal(signal.SIGINT, inherited)


def test_a_signal_asks_to_stop_a_second_one_stops_at_once(python_sigint):
  before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
  assert before[signal.SIGINT] is signal.default_int_handler
  with preemption.PreemptionGuard() as guard:
    assert guard.mode == "local" and not guard.should_stop(1)
    os.kill(os.getpid(), signal.SIGTERM)
    assert guard.should_stop(2) and guard.cause == "SIGTERM"
    with pytest.raises(KeyboardInterrupt):   # a second signal: the previous handler, now
      os.kill(os.getpid(), signal.SIGINT)
    assert {s: signal.getsignal(s) for s in before} == before   # already restored
  assert {s: signal.getsignal(s) for s in before} == before
  error = preemption.PreemptedError(7, "SIGTERM")
  assert str(error) == "preempted at step 7; rerun the same command to continue"
  assert isinstance(error, errors.RunError) and preemption.PREEMPTED_EXIT_CODE not in (0, 1)


def _send_at(step_to_signal, signum):
  def hook(step):
    if step == step_to_signal:
      os.kill(os.getpid(), signum)
  return hook


@pytest.mark.slow
def test_preempted_runs_save_their_step_and_resume_bit_identical(presence_task, tmp_path,
                                                                 straight):
  """SIGTERM after a seeded random step between checkpoints, then SIGINT at the last step
  (after its last check: the loop has ended), then a clean rerun."""
  config, workdir = fault_config(), str(tmp_path / "run")
  handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
  sent = random.Random(27).choice([2, 4, 6, 8])   # checkpoints every 2: saved anyway
  with pytest.raises(preemption.PreemptedError) as error:
    trainer.train_and_evaluate(config, workdir, data=presence_task,
                               step_hook=_send_at(sent, signal.SIGTERM))
  stopped = sent + 1   # the signal came after step `sent`'s check: the next step finishes
  assert str(error.value) == f"preempted at step {stopped}; rerun the same command to continue"
  assert (error.value.step, error.value.cause) == (stopped, "SIGTERM")
  assert {s: signal.getsignal(s) for s in handlers} == handlers
  assert not os.path.exists(os.path.join(workdir, run_folder.LOCK_FILE))
  assert not os.path.exists(os.path.join(workdir, "results.json")), "no test was run"
  assert _restored_steps(workdir)[-1] == stopped, "an extra checkpoint at the signal's step"
  records = read_records(os.path.join(workdir, "metrics.jsonl"))
  assert (stopped, "train") in [(r["step"], r["split"]) for r in records]
  assert max(r["step"] for r in records) == stopped
  if stopped % config.eval_frequency:   # no extra validation: the best stays a straight run's
    assert (stopped, "val") not in [(r["step"], r["split"]) for r in records]

  seen = []

  def hook(step):
    seen.append(step)
    _send_at(config.num_train_steps, signal.SIGINT)(step)

  with pytest.raises(preemption.PreemptedError, match="^preempted at step 10;") as error:
    trainer.train_and_evaluate(config, workdir, data=presence_task, step_hook=hook)
  assert seen == list(range(stopped + 1, 11)) and error.value.cause == "SIGINT"
  assert not os.path.exists(os.path.join(workdir, "results.json"))

  seen.clear()
  results = trainer.train_and_evaluate(config, workdir, data=presence_task,
                                       step_hook=seen.append)
  assert seen == [], "step 10 was saved: only the tests run"
  straight_dir, straight_results = straight
  for which in ("latest", "best"):
    ours, theirs = (_params(w, config, presence_task, which) for w in (workdir, straight_dir))
    chex.assert_trees_all_equal(ours, theirs)
    assert run_guard.state_crc32(ours) == run_guard.state_crc32(theirs)
  for key in ("best_step", "best_val_accuracy", "test_accuracy_best_val", "test_accuracy_final",
              "test_loss_best_val", "final_step", "complete", "config_fingerprint"):
    assert results[key] == straight_results[key], key
  assert results["complete"] is True and results["stopped_by"] is None
  assert results["config_fingerprint"] == run_record.config_fingerprint(config)
  with open(os.path.join(workdir, "results.json")) as f:
    assert run_record.results_problem(json.load(f), config) is None


TINY_LISTOPS = "configs/listops/simple.py:tiny"


TINY_STEPS = 10


def _tiny_listops_overrides():
  """10 steps of the small ListOps run (conftest.SMALL_LISTOPS), logged every step, validated
  and saved every 5. The SIGTERM comes after step 1's record: the 8 steps left take over a
  second, far longer than the signal takes to land (the rerun trains what is left)."""
  return [*SMALL_LISTOPS,
          f"--config.num_train_steps={TINY_STEPS}", "--config.log_every=1",
          "--config.eval_frequency=5", "--config.checkpoint_every=5", "--config.warmup=1"]


@pytest.mark.slow
def test_train_py_exits_75_on_sigterm_and_the_rerun_finishes(tmp_path):
  workdir = tmp_path / "run"
  overrides = _tiny_listops_overrides()
  command = [sys.executable, "train.py", "--config", TINY_LISTOPS, *overrides,
             "--workdir", str(workdir)]
  proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  try:
    metrics, started = workdir / "metrics.jsonl", time.time()
    while not (metrics.exists() and '"split": "train"' in metrics.read_text()):
      assert proc.poll() is None and time.time() - started < 300, proc.communicate()[1][-3000:]
      time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == preemption.PREEMPTED_EXIT_CODE, stderr[-3000:]
  assert "Traceback" not in stderr, stderr[-3000:]
  match = re.search(r"^train\.py: preempted at step (\d+); rerun the same command to continue$",
                    stderr.strip().splitlines()[-1])
  assert match, stderr[-3000:]
  step = int(match.group(1))
  assert step < TINY_STEPS and _restored_steps(str(workdir))[-1] == step
  assert not (workdir / run_folder.LOCK_FILE).exists()
  proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"Resumed from {workdir}/checkpoints at step {step}" in proc.stderr
  results = json.loads((workdir / "results.json").read_text())
  assert results["complete"] is True and results["final_step"] == TINY_STEPS
  # scripts/seeds.py builds the same config from the same command line: the seed counts.
  expected = seeds.expected_config(TINY_LISTOPS, overrides, seed=0)
  assert run_record.config_fingerprint(expected) == results["config_fingerprint"]
  assert seeds.results_status(str(workdir), expected) is None


# Two processes (tests/multihost_worker.py) in which process 1 gets SIGTERM after step 1, and
# every step then waits a second so that the notice reaches process 0 before the run ends.
_SIGNALLED_WORKER = """
import os, signal, sys, time
sys.path.insert(0, {root!r})
from tests import multihost_worker as worker
from simpletron_jax.train import trainer
train = trainer.train_and_evaluate
args = worker.parse_args(sys.argv[1:])

def signalled(config, workdir, step_hook=None, **kwargs):
  def hook(step):
    if step == 1 and args.process_id == 1:
      os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1.0)
    if step_hook:
      step_hook(step)
  return train(config, workdir, step_hook=hook, **kwargs)

trainer.train_and_evaluate = signalled
worker.main(sys.argv[1:])
"""


def _run_two_processes(tmp_path, name, signalled):
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=1 "
                       "--xla_backend_optimization_level=0 "
                       "--xla_llvm_disable_expensive_passes=true "
                       "--xla_cpu_use_fusion_emitters=false")
  program = ["-c", _SIGNALLED_WORKER.format(root=ROOT)] if signalled else [worker.__file__]
  procs = [subprocess.Popen(
      [sys.executable, *program, f"--process_id={i}", f"--port={port}",
       f"--workdir={tmp_path / 'run'}", f"--out={tmp_path / f'{name}_{i}.json'}"],
      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for i in range(2)]
  try:
    logs = [p.communicate(timeout=300)[0] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  return [p.returncode for p in procs], logs


@pytest.mark.multihost
@pytest.mark.slow
def test_two_hosts_stop_at_the_same_step_when_one_gets_sigterm(tmp_path, tmp_path_factory):
  codes, logs = _run_two_processes(tmp_path, "signalled", signalled=True)
  stopped = [re.findall(r"PreemptedError: preempted at step (\d+);", log) for log in logs]
  assert codes == [1, 1] and all(len(s) == 1 for s in stopped), "\n\n".join(logs)
  step = int(stopped[0][0])
  assert int(stopped[1][0]) == step and 1 < step < 6, stopped
  workdir = str(tmp_path / "run")
  assert _restored_steps(workdir)[-1] == step
  assert not os.path.exists(os.path.join(workdir, run_folder.LOCK_FILE))
  codes, logs = _run_two_processes(tmp_path, "resumed", signalled=False)
  assert codes == [0, 0], "\n\n".join(log[-3000:] for log in logs)
  resumed = json.loads((tmp_path / "resumed_0.json").read_text())
  assert resumed["results"]["complete"] and resumed["results"]["final_step"] == 6
  # The same run in this process on its two devices (as test_multihost.py compares them,
  # which shares it when it runs in this process).
  single, record = worker.single_process_run(str(tmp_path_factory.mktemp("single")))
  data = worker.presence_data()
  train_loads = [idx for split, idx in record["loads"] if split == "train"]
  resumed_first = [idx for split, idx in resumed["loads"] if split == "train"][0]
  assert resumed_first == train_loads[step][:len(train_loads[step]) // 2], "resumed at `step`"
  chex.assert_trees_all_close(_params(workdir, worker.worker_config(), data),
                              _params(single, worker.worker_config(), data),
                              rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------
# A disk that fills.


class SmallDisk:
  """A folder on a tmpfs of ``size_mib`` MiB, mounted for one test, that :meth:`fill` fills.

  Where mounting is refused (not root, no ``CAP_SYS_ADMIN``) or ``SIMPLETRON_TEST_NO_MOUNT=1``
  is set, a plain folder in which, after :meth:`fill`, every Python write or flush of a file
  under it and every orbax save into it raises ``OSError(ENOSPC)``: what a full tmpfs does,
  without the few KiB a real one still has at the end of each file's last page.
  """

  def __init__(self, path, monkeypatch, size_mib=8):
    self.path, self.full, self.mode = str(path), False, "tmpfs"
    os.makedirs(self.path, exist_ok=True)
    mounted = False
    if not os.environ.get("SIMPLETRON_TEST_NO_MOUNT"):
      try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs",
                                  self.path], capture_output=True, timeout=30).returncode == 0
      except (OSError, subprocess.SubprocessError):
        pass
    if not mounted:
      self.mode = "simulated"
      self._simulate(monkeypatch)

  def under(self, path) -> bool:
    return os.path.abspath(os.fspath(path)).startswith(self.path + os.sep)

  def enospc(self, path):
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

  def _simulate(self, monkeypatch):
    disk, real_open, real_save = self, builtins.open, ocp.CheckpointManager.save

    class FullFile:
      def __init__(self, f, path):
        self._f, self._path = f, path

      def write(self, data):
        if disk.full:
          raise disk.enospc(self._path)
        return self._f.write(data)

      def flush(self):
        if disk.full:
          raise disk.enospc(self._path)
        return self._f.flush()

      def __enter__(self):
        return self

      def __exit__(self, *exc_info):
        self._f.close()

      def __getattr__(self, name):
        return getattr(self._f, name)

    def open_(file, mode="r", *args, **kwargs):
      f = real_open(file, mode, *args, **kwargs)
      writing = isinstance(file, (str, os.PathLike)) and set(mode) & set("wax+")
      return FullFile(f, file) if writing and disk.under(file) else f

    def save(manager, step, *args, **kwargs):
      if disk.full and disk.under(manager.directory):
        raise disk.enospc(os.path.join(str(manager.directory), str(step)))
      return real_save(manager, step, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", open_)
    monkeypatch.setattr(ocp.CheckpointManager, "save", save)

  def fill(self) -> None:
    """Takes every free block (a filler file); :meth:`free` gives them back."""
    self.full = True
    if self.mode == "tmpfs":
      fd = os.open(os.path.join(self.path, "filler"), os.O_WRONLY | os.O_CREAT)
      try:
        while True:
          os.write(fd, b"\0" * 65536)
      except OSError as e:
        assert e.errno == errno.ENOSPC, e
      try:
        while True:
          os.write(fd, b"\0" * 512)
      except OSError:
        pass
      os.close(fd)

  def free(self) -> None:
    self.full = False
    if self.mode == "tmpfs":
      os.remove(os.path.join(self.path, "filler"))

  def unmount(self) -> None:
    if self.mode == "tmpfs":
      subprocess.run(["umount", "-l", self.path], capture_output=True, timeout=30)


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
  """A :class:`SmallDisk` under ``tmp_path``, unmounted after the test."""
  disk = SmallDisk(tmp_path / "disk", monkeypatch)
  print(f"small disk: {disk.mode}")
  yield disk
  disk.unmount()


def _one_line_naming(error, path):
  message = str(error)
  assert "\n" not in message and str(path) in message, message
  assert "No space left on device" in message or "errno 28" in message, message
  return message


def test_metric_logs_on_a_full_disk_raise_naming_the_file_instead_of_hanging(small_disk):
  workdir = small_disk.path
  logger = MetricLogger(workdir)
  logger.write(0, {"params": 10}, "info")
  small_disk.fill()
  with deadline(60), pytest.raises(errors.WriteError) as error:
    for step in range(1, 5000):   # a tmpfs still holds the rest of each file's last page
      logger.write(step, {f"metric_{i}": 0.5 for i in range(8)}, "train")
  _one_line_naming(error.value, os.path.join(workdir, ""))
  assert logger.path in str(error.value) or logger.tb_path in str(error.value)
  with contextlib.suppress(errors.WriteError):
    logger.close()
  print(f"failed write: {error.value}")
  small_disk.free()
  with warnings.catch_warnings():   # a line the failed write tore is dropped with a warning
    warnings.simplefilter("ignore")
    steps = [r["step"] for r in read_records(logger.path)]
  assert steps == list(range(len(steps))) and steps, "the records before the failure are kept"


def _read_events(path):
  """The events of a TensorBoard file, read with TensorBoard's own loader (record CRCs
  checked)."""
  from tensorboard.backend.event_processing import \
      event_file_loader  # pylint: disable=import-outside-toplevel
  return list(event_file_loader.EventFileLoader(str(path)).Load())


def _whole_records(path):
  """The number of TFRecords in ``path``; fails unless the file ends exactly after its last
  record and every CRC matches (TensorBoard's loader silently skips a torn tail). CRCs are
  checked with TensorBoard's own ``masked_crc32c``, not the writer's."""
  import struct  # pylint: disable=import-outside-toplevel
  from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import \
      masked_crc32c  # pylint: disable=import-outside-toplevel
  with open(path, "rb") as f:
    data = f.read()
  pos, count = 0, 0
  while pos < len(data):
    assert pos + 12 <= len(data), f"{path}: a torn record header at byte {pos}"
    (length,), (length_crc,) = struct.unpack("<Q", data[pos:pos + 8]), \
        struct.unpack("<I", data[pos + 8:pos + 12])
    assert length_crc == masked_crc32c(data[pos:pos + 8]), f"{path}: bad length CRC at {pos}"
    end = pos + 12 + length + 4
    assert end <= len(data), f"{path}: a torn record at byte {pos}"
    body = data[pos + 12:pos + 12 + length]
    assert struct.unpack("<I", data[end - 4:end])[0] == masked_crc32c(body), pos
    pos, count = end, count + 1
  return count


def _scalars(events):
  """``(step, tag, value)`` of the summary values of ``events``."""
  from tensorboard.util import tensor_util  # pylint: disable=import-outside-toplevel
  return [(e.step, v.tag, float(tensor_util.make_ndarray(v.tensor)))
          for e in events if e.HasField("summary") for v in e.summary.value]


def test_tensorboard_events_are_on_disk_after_each_write_and_resume_purges(tmp_path):
  logger = MetricLogger(str(tmp_path))
  first = logger.tb_path
  assert os.path.dirname(first) == str(tmp_path / "tb") and ".tfevents." in first
  for step in (1, 2, 3):
    logger.write(step, {"loss": 1.0 / step}, "train")
    assert _scalars(_read_events(first))[-1] == (step, "train/loss", pytest.approx(1 / step))
  logger.close()
  resumed = MetricLogger(str(tmp_path), resume_step=2)
  resumed.write(3, {"loss": 0.25}, "train")
  resumed.close()
  assert resumed.tb_path != first and os.path.exists(first)   # a new file; history kept
  assert len(_scalars(_read_events(first))) == 3
  head = _read_events(resumed.tb_path)
  assert head[0].file_version == "brain.Event:2"
  assert head[1].step == 3 and head[1].session_log.status == head[1].session_log.START
  assert _scalars(head) == [(3, "train/loss", 0.25)]
  assert _whole_records(resumed.tb_path) == len(head) == 3
  assert [r["step"] for r in read_records(resumed.path)] == [1, 2, 3]


def test_a_failing_tensorboard_file_stops_the_logger(tmp_path, small_disk, monkeypatch):
  """The event file, not the JSONL file, fails (tensorboardX's writer thread used to die
  there and leave add_scalar blocked on its queue): ``workdir/tb`` lies on a small tmpfs that
  fills, so the event writer meets ENOSPC. Where no tmpfs can be mounted, the event file's
  writes are made to fail as they do then. Every event before the failure stays readable,
  and no torn record is left behind."""
  from simpletron_jax.run import tensorboard_writer  # pylint: disable=import-outside-toplevel
  workdir = tmp_path / "run"
  os.makedirs(workdir)
  os.makedirs(os.path.join(small_disk.path, "tb"))
  os.symlink(os.path.join(small_disk.path, "tb"), workdir / "tb")
  if small_disk.mode != "tmpfs":
    class FullEventFile:
      """The event file; its writes fail with ENOSPC once the disk is full."""

      def __init__(self, f, path):
        self._f, self._path = f, path

      def write(self, data):
        if small_disk.full:
          raise small_disk.enospc(self._path)
        return self._f.write(data)

      def __getattr__(self, name):
        return getattr(self._f, name)

    monkeypatch.setattr(tensorboard_writer, "open",
                        lambda path, *a, **k: FullEventFile(builtins.open(path, *a, **k), path),
                        raising=False)
  logger = MetricLogger(str(workdir))
  logger.write(0, {"params": 10}, "info")
  small_disk.fill()
  with deadline(60), pytest.raises(errors.WriteError) as error:
    for step in range(1, 5000):   # a tmpfs still holds the rest of the file's last page
      logger.write(step, {"loss": 0.5, "accuracy": 0.25}, "train")
  message = _one_line_naming(error.value, logger.tb_path)
  assert message.startswith(f"could not write the TensorBoard events file {logger.tb_path}: "
                            "No space left on device "
                            "(errno 28); the events before these are kept"), message
  with contextlib.suppress(errors.WriteError):
    logger.close()
  steps = [r["step"] for r in read_records(logger.path)]
  assert steps == list(range(len(steps))) and len(steps) >= 2   # the JSONL file is intact
  # The failing step is the JSONL file's last; every step before it is in the event file.
  events = _read_events(logger.tb_path)
  assert sorted({step for step, _, _ in _scalars(events)}) == steps[:-1]
  assert _whole_records(logger.tb_path) == len(events)


def test_atomic_json_on_a_full_disk_keeps_the_previous_file(small_disk):
  path = os.path.join(small_disk.path, "results.json")
  atomic_io.write_json_atomic(path, {"test_accuracy": 0.5})
  small_disk.fill()
  with pytest.raises(errors.WriteError) as error:
    atomic_io.write_json_atomic(path, {"test_accuracy": 0.75, "padding": "x" * 20000})
  _one_line_naming(error.value, path)
  with open(path) as f:
    assert json.load(f) == {"test_accuracy": 0.5}
  assert not os.path.exists(path + ".tmp")


@pytest.mark.slow
@pytest.mark.parametrize("fill_at", [5, 10])
def test_a_disk_filling_during_a_run_stops_it_naming_the_file(presence_task, small_disk,
                                                             straight, fill_at):
  """Filled after step 5 (a checkpoint, a log or a validation fails first) or after the last
  step (the test logs or results.json fail). Freed, the rerun ends as a straight run."""
  config, workdir = fault_config(), os.path.join(small_disk.path, "run")

  def hook(step):
    if step == fill_at:
      small_disk.fill()

  with deadline(300), pytest.raises((errors.WriteError, errors.CheckpointError)) as error:
    trainer.train_and_evaluate(config, workdir, data=presence_task, step_hook=hook)
  message = str(error.value)
  assert "\n" not in message and workdir in message, message
  assert "No space left on device" in message or "errno 28" in message, message
  assert not os.path.exists(os.path.join(workdir, "results.json"))
  assert not os.path.exists(os.path.join(workdir, run_folder.LOCK_FILE))
  saved = _restored_steps(workdir)
  assert saved and saved[-1] >= fill_at - 1
  _params(workdir, config, presence_task)   # the newest checkpoint restores (CRC checked)
  small_disk.free()
  results = trainer.train_and_evaluate(config, workdir, data=presence_task)
  chex.assert_trees_all_equal(_params(workdir, config, presence_task),
                              _params(straight[0], config, presence_task))
  assert results["test_accuracy_best_val"] == straight[1]["test_accuracy_best_val"]
  assert results["complete"]


@pytest.mark.slow
def test_rerun_of_a_finished_run_on_a_full_disk_keeps_its_results(presence_task, small_disk,
                                                                 monkeypatch):
  """The disk fills once the logs are open: the test's records or the new results.json
  cannot be written; the finished run's results.json stays as it was. (A plain rerun of a
  finished run opens no log and writes nothing, issue 48; a forced change still does.)"""
  config = fault_config(num_train_steps=4, eval_frequency=2, warmup=2)
  workdir = os.path.join(small_disk.path, "run")
  trainer.train_and_evaluate(config, workdir, data=presence_task)
  with open(os.path.join(workdir, "results.json")) as f:
    before = f.read()

  class FillingLogger(MetricLogger):
    def __init__(self, *args, **kwargs):
      super().__init__(*args, **kwargs)
      small_disk.fill()

  monkeypatch.setattr(metric_logging, "MetricLogger", FillingLogger)
  with deadline(120), pytest.raises(errors.WriteError) as error:
    trainer.train_and_evaluate(fault_config(num_train_steps=4, eval_frequency=2, warmup=2,
                                            learning_rate=0.01), workdir,
                                 data=presence_task, allow_resume_changes=True)
  _one_line_naming(error.value, workdir)
  print(f"failed write: {error.value}")
  with open(os.path.join(workdir, "results.json")) as f:
    assert f.read() == before
  assert not os.path.exists(os.path.join(workdir, "results.json.tmp"))
  assert _restored_steps(workdir)[-1] == 4


# ----------------------------------------------------------------------------
# results.json, scripts/seeds.py and scripts/compare.py.


@pytest.mark.slow
def test_a_resumed_run_removes_the_results_it_trains_past(presence_task, tmp_path):
  """A finished run continued to more steps and killed: no stale results.json is left."""
  workdir = str(tmp_path / "run")
  first = trainer.train_and_evaluate(fault_config(num_train_steps=4, warmup=2), workdir,
                                     data=presence_task)
  assert first["complete"] and first["final_step"] == 4

  def kill(step):
    if step == 5:
      raise KeyboardInterrupt   # killed without a handler: no save, no results

  with pytest.raises(KeyboardInterrupt):
    trainer.train_and_evaluate(fault_config(num_train_steps=6, warmup=2), workdir,
                               data=presence_task, step_hook=kill)
  assert not os.path.exists(os.path.join(workdir, "results.json"))
  out_of_time = fault_config(num_train_steps=8, warmup=2, max_train_minutes=1e-9)
  results = trainer.train_and_evaluate(out_of_time, workdir, data=presence_task)
  assert results["complete"] is False and results["final_step"] == 5
  assert results["stopped_by"] == "max_train_minutes"
  with open(os.path.join(workdir, "results.json")) as f:
    assert "incomplete: training stopped at step 5 of 8" in run_record.results_problem(
        json.load(f))


def _results(config, **changes):
  base = {"task": "listops", "attention": "simple", "test_accuracy": 0.5,
          "test_accuracy_best_val": 0.5, "test_accuracy_final": 0.25, "complete": True,
          "final_step": config.num_train_steps, "last_step": config.num_train_steps,
          "num_train_steps": config.num_train_steps,
          "config_fingerprint": run_record.config_fingerprint(config)}
  return {**base, **changes}


def _write_run(folder, config, results):
  os.makedirs(folder, exist_ok=True)
  if config is not None:
    with open(os.path.join(folder, "config.json"), "w") as f:
      f.write(config.to_json_best_effort(indent=2))
  if results is not None:
    with open(os.path.join(folder, "results.json"), "w") as f:
      f.write(json.dumps(results))   # NaN stays NaN, as an older train.py could write it


def test_seeds_count_only_finished_runs_of_the_same_config(tmp_path):
  def config_for(seed):
    config = fault_config()
    config.seed = seed
    return config

  other = config_for(3)
  other.learning_rate = 0.01
  cases = {   # seed: the results.json found, or None
      0: _results(config_for(0)),
      1: _results(config_for(1), complete=False, final_step=4, last_step=4,
                  stopped_by="max_train_minutes"),
      2: {k: v for k, v in _results(config_for(2), last_step=6).items()
          if k not in ("complete", "final_step", "config_fingerprint")},   # an older file
      3: _results(other),
      4: _results(config_for(4), final_step=8, last_step=8),
      5: _results(config_for(5), test_accuracy_final=float("nan")),
      6: None,
  }
  root = str(tmp_path / "seeds")
  for seed, results in cases.items():
    _write_run(seeds.seed_dir(root, seed), config_for(seed), results)
  trained, log = [], []

  def train(seed, workdir):
    trained.append(seed)
    _write_run(workdir, None, _results(config_for(seed)))

  results = seeds.run_seeds(list(cases), root, train, log=log.append, config_for=config_for)
  assert trained == [1, 2, 3, 4, 5, 6] and sorted(results) == list(cases)
  reasons = dict(zip(cases, log))
  assert reasons[0].startswith("seed 0: done") and "not counted" not in reasons[0]
  assert "incomplete: training stopped at step 4 of 10 (max_train_minutes)" in reasons[1]
  assert "incomplete: training stopped at step 6 of 10" in reasons[2]
  assert "computed with another config" in reasons[3]
  assert "computed at step 8, but the config trains 10 steps" in reasons[4]
  assert "test_accuracy_final is nan" in reasons[5]
  assert reasons[6] == f"seed 6: new ({seeds.seed_dir(root, 6)})"

  def broken_train(seed, workdir):
    _write_run(workdir, None, _results(config_for(seed), complete=False, final_step=3))

  os.remove(os.path.join(seeds.seed_dir(root, 6), "results.json"))
  with pytest.raises(seeds.SeedError, match=r"^seed 6: training ended, but .*seed6/results.json: "
                                            r"incomplete: training stopped at step 3 of 10"):
    seeds.run_seeds([6], root, broken_train, log=lambda _: None, config_for=config_for)


def test_compare_leaves_out_unfinished_and_nan_runs_and_says_why(tmp_path, monkeypatch,
                                                                capsys):
  config = fault_config()
  root = tmp_path / "runs"
  for seed in (0, 1):
    _write_run(root / "simple" / f"seed{seed}", config,
               _results(config, test_accuracy_final=0.25 + 0.1 * seed))
  _write_run(root / "simple" / "seed2", config, None)   # still training
  _write_run(root / "simple" / "seed3", config, _results(config, test_accuracy=float("nan")))
  _write_run(root / "simple" / "seed4", config, _results(config, complete=False))
  with pytest.raises(SystemExit, match=r"^compare.py: 3 run folder\(s\) left out of the table "):
    compare.main([str(root), "--no_plot"])
  text = (root / "comparison.md").read_text()
  assert "| simple | listops | `simple` | 2 |" in text and "nan" not in text.split("Left out")[0]
  assert "simple/seed2: no results.json" in text
  assert "simple/seed3: results.json: test_accuracy is nan" in text
  assert "simple/seed4: results.json: incomplete" in text
  assert "Left out of the table" in capsys.readouterr().out
  assert not (root / "comparison.png").exists()
  for seed in (2, 3, 4):
    _write_run(root / "simple" / f"seed{seed}", config, _results(config))
  capsys.readouterr()
  monkeypatch.setitem(sys.modules, "matplotlib", None)   # `pip install -e .`: not installed
  text = compare.main([str(root)])   # the table is the output: exit status 0 (issue 47)
  assert text == (root / "comparison.md").read_text()
  assert "| simple | listops | `simple` | 5 |" in text
  assert not (root / "comparison.png").exists()
  assert capsys.readouterr().err.strip().splitlines() == [
      f"compare.py: {root / 'comparison.png'} not written: matplotlib is not installed; "
      "pip install -e \".[bench]\" for the chart, or pass --no_plot"]
  _write_run(tmp_path / "unfinished" / "seed0", config, None)
  with pytest.raises(SystemExit, match=r"^compare.py: no finished run .*seed0: no results.json"):
    compare.main([str(tmp_path / "unfinished"), "--no_plot"])
  with pytest.raises(SystemExit, match=r"^compare.py: .*nothing is not a folder$"):
    compare.main([str(tmp_path / "nothing")])


def test_a_lock_that_cannot_be_written_is_a_write_error_and_leaves_no_lock(tmp_path,
                                                                          monkeypatch):
  real_fdopen = os.fdopen

  class Full:
    def __init__(self, fd):
      self.f = real_fdopen(fd, "w")
    def write(self, data):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    def __enter__(self):
      return self
    def __exit__(self, *exc_info):
      self.f.close()

  monkeypatch.setattr(os, "fdopen", lambda fd, mode="r", *a, **k: Full(fd))
  with pytest.raises(errors.WriteError) as error:
    run_folder.acquire_lock(str(tmp_path))
  _one_line_naming(error.value, os.path.join(tmp_path, run_folder.LOCK_FILE))
  monkeypatch.undo()
  assert not os.path.exists(os.path.join(tmp_path, run_folder.LOCK_FILE))
  run_folder.release_lock(run_folder.acquire_lock(str(tmp_path)))   # the rerun takes the lock
