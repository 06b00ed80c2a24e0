"""Issue 48: nothing silent, no tracebacks (the in-process cases).

* A rerun of a finished run changes nothing: no file is rewritten, no ``(step, split)`` record
  is written twice, and ``val_majority_rate`` is the last validation's whichever start reached
  the end (a start that trains no step reported the whole split's before).
* ``--allow_resume_changes`` on a finished run is marked in ``results.json``
  (``forced_resume_changes``), and ``scripts/seeds.py`` and ``scripts/compare.py`` refuse to
  count it as a finished run of the new config unless told to (``--count_forced``).
* ``run.lock`` is released on every exit path: missing data, a model that cannot be built, a
  refused resume.
* ``init_from`` checks its source checkpoint as ``eval.py`` does; ``eval.py`` names a config of
  another task; a signal while the steps precompile stops the run as a preemption does; progress
  without a terminal is whole lines; a failed restore's abandoned reads print nothing; the
  scripts name train.py's one-line error and refuse a ``--copy_to`` file before training.

Most runs are the presence task with a 1-layer model (``tests/test_faults.py``); one finished
run is shared by the module and copied by each test that changes it.
"""

import asyncio
import gc
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
import warnings

import chex
import jax
import pytest

from configs import lra
from simpletron_jax.data import text
from simpletron_jax.runtime import cli, errors, progress
from simpletron_jax.tools import reporting
from simpletron_jax.train import (
    checkpoint_faults,
    checkpoints,
    final_test,
    precompile,
    saved_runs,
    train_state,
    trainer,
)
from simpletron_jax.run import preemption, run_folder, run_guard, run_record
from simpletron_jax.run.metric_logging import read_records
from tests.conftest import ROOT
from tests.test_faults import _kill_at, _params, fault_config
from tests.test_train import Killed

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import compare  # noqa: E402  pylint: disable=wrong-import-position
import seeds  # noqa: E402  pylint: disable=wrong-import-position


def rerun_config(**overrides):
  """:func:`fault_config` validating one batch (16 of the 200 val examples), so the majority
  rate of the examples validated differs from the whole split's."""
  return fault_config(**{"num_train_steps": 6, "eval_frequency": 3, "num_eval_steps": 1,
                         **overrides})


@pytest.fixture(scope="module")
def finished(presence_task, tmp_path_factory):
  """A finished :func:`rerun_config` run: (workdir, results)."""
  workdir = str(tmp_path_factory.mktemp("finished") / "run")
  return workdir, trainer.train_and_evaluate(rerun_config(), workdir, data=presence_task)


def _copy(finished, tmp_path, name="run"):
  workdir = str(tmp_path / name)
  shutil.copytree(finished[0], workdir)
  return workdir


def _truncate_arrays(folder):
  """Cuts every array data file (orbax's ``d/`` files) of a checkpoint in half: which of them
  a restore reads depends on how orbax laid the arrays out."""
  for d, _, names in os.walk(folder):
    if os.path.basename(d) == "d":
      for name in names:
        path = os.path.join(d, name)
        with open(path, "r+b") as f:
          f.truncate(os.path.getsize(path) // 2)


def _files(workdir):
  """``{relative path: bytes}`` of every file under ``workdir``."""
  out = {}
  for folder, _, names in os.walk(workdir):
    for name in names:
      path = os.path.join(folder, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, workdir)] = f.read()
  return out


def _keys(workdir):
  """The ``(step, split)`` of every record of ``metrics.jsonl`` but the per-start ``info``."""
  return [(r["step"], r["split"]) for r in read_records(os.path.join(workdir, "metrics.jsonl"))
          if r["split"] != "info"]


def _results(workdir):
  with open(os.path.join(workdir, "results.json")) as f:
    return json.load(f)


PER_START = ("train_compile_seconds_this_run", "train_shapes_compiled_in_loop",
             "wall_seconds_this_run")   # what the start that wrote results.json did


# ----------------------------------------------------------------------------
# Reruns of a finished run.


@pytest.mark.slow
def test_a_rerun_of_a_finished_run_changes_nothing(finished, presence_task, tmp_path):
  workdir = _copy(finished, tmp_path)
  before = _files(workdir)
  assert run_folder.LOCK_FILE not in before
  results = trainer.train_and_evaluate(rerun_config(), workdir, data=presence_task)
  assert results == _results(workdir) == finished[1]
  # An allowed change (reporting only) computes nothing new either.
  trainer.train_and_evaluate(rerun_config(eval_frequency=2, log_every=1), workdir,
                             data=presence_task)
  assert _files(workdir) == before, "a rerun of a finished run rewrote a file"
  assert len(_keys(workdir)) == len(set(_keys(workdir)))


@pytest.mark.slow
def test_every_way_to_the_end_gives_the_same_results_and_no_duplicate(finished, presence_task,
                                                                      tmp_path, capsys):
  """Killed right after the last step's checkpoint (before the test), then resumed: the start
  that trains no step reports the validated examples' majority rate, as the straight run did.
  Killed after writing the test records but before results.json: they are reused, not
  recorded twice. Progress without a terminal is whole lines."""
  straight_dir, straight = finished
  val_split_rate = presence_task.val.majority_rate()
  assert straight["val_majority_rate"] != val_split_rate, "the case needs a partial validation"
  workdir = str(tmp_path / "killed_at_the_end")
  with pytest.raises(Killed):
    trainer.train_and_evaluate(rerun_config(), workdir, data=presence_task,
                               step_hook=_kill_at(6))
  assert not os.path.exists(os.path.join(workdir, "results.json"))
  results = trainer.train_and_evaluate(rerun_config(), workdir, data=presence_task)
  assert results["val_majority_rate"] == straight["val_majority_rate"]
  for key in set(straight) - set(PER_START) - {"steps_per_sec", "train_seconds"}:
    assert results[key] == straight[key], key
  assert _keys(workdir) == _keys(straight_dir)
  chex.assert_trees_all_equal(_params(workdir, rerun_config(), presence_task),
                              _params(straight_dir, rerun_config(), presence_task))

  os.remove(os.path.join(workdir, "results.json"))   # a kill after the test records
  again = trainer.train_and_evaluate(rerun_config(), workdir, data=presence_task)
  assert {k: v for k, v in again.items() if k not in PER_START} == {
      k: v for k, v in results.items() if k not in PER_START}
  assert _keys(workdir) == _keys(straight_dir), "test records written twice"

  trainer.train_and_evaluate(rerun_config(num_train_steps=8), workdir, data=presence_task)
  err = capsys.readouterr().err
  lines = [line for line in err.splitlines() if line.startswith("train: ")]
  assert lines and lines[-1].startswith("train: 8/8 (100%), ") and "loss=" in lines[-1], err
  assert "\r" not in err


@pytest.mark.slow
def test_a_forced_change_on_a_finished_run_is_marked_and_not_counted(finished, presence_task,
                                                                     tmp_path):
  root = tmp_path / "runs"
  workdir = _copy(finished, root, "seed0")
  changed = rerun_config(learning_rate=0.01)
  with pytest.raises(errors.ConfigMismatchError, match="--allow_resume_changes"):
    trainer.train_and_evaluate(changed, workdir, data=presence_task)
  results = trainer.train_and_evaluate(changed, workdir, data=presence_task,
                                       allow_resume_changes=True)
  assert results["forced_resume_changes"] == [{"step": 6, "fields": ["learning_rate"]}]
  assert results == _results(workdir)
  assert results["config_fingerprint"] == run_record.config_fingerprint(changed)
  for key in ("test_accuracy_best_val", "test_accuracy_final", "best_step", "val_majority_rate"):
    assert results[key] == finished[1][key], key   # nothing was trained with the new rate
  assert len(_keys(workdir)) == len(set(_keys(workdir)))
  problem = run_record.results_problem(results, changed)
  assert problem.startswith("it was resumed with --allow_resume_changes (learning_rate at "
                            "step 6)") and "--count_forced" in problem, problem
  assert run_record.results_problem(results, changed, count_forced=True) is None
  assert seeds.seed_state(workdir, changed) == "resume"
  assert seeds.seed_state(workdir, changed, count_forced=True) == "done"
  groups, left_out = compare.collect_runs(str(root))
  assert groups == [] and left_out == [f"seed0: results.json: {problem}"]
  groups, left_out = compare.collect_runs(str(root), count_forced=True)
  assert [len(g.results) for g in groups] == [1] and left_out == []
  # The same forced command again changes nothing.
  before = _files(workdir)
  trainer.train_and_evaluate(changed, workdir, data=presence_task, allow_resume_changes=True)
  assert _files(workdir) == before


def test_a_run_records_its_software_outside_its_config(finished):
  """config.json and results.json name the versions, devices and commit (issue 47); they
  enter neither the config nor its fingerprint, so a run still counts after an upgrade."""
  workdir, results = finished
  with open(os.path.join(workdir, "config.json")) as f:
    saved = json.load(f)
  software = saved[run_record.SOFTWARE_KEY]
  assert software == {k: results[k] for k in software} and "orbax_checkpoint_version" in software
  assert (results["jax_version"], results["device_kind"], results["device_count"],
          results["process_count"]) == (jax.__version__, jax.devices()[0].device_kind,
                                        jax.device_count(), 1)
  assert results["config_fingerprint"] == run_record.config_fingerprint(rerun_config())
  assert run_record.config_fingerprint(saved) == results["config_fingerprint"]
  assert run_record.results_problem(results, saved) is None
  assert run_record.SOFTWARE_KEY not in run_folder.RunFolder(workdir).saved_config()
  older = {**saved, run_record.SOFTWARE_KEY: {**software, "jax_version": "0.0.1"}}
  assert run_record.config_fingerprint(older) == results["config_fingerprint"]


# ----------------------------------------------------------------------------
# The lock on every exit path.


@pytest.mark.slow
def test_the_lock_is_released_on_every_exit_path(finished, presence_task, tmp_path,
                                                 monkeypatch):
  lock = run_folder.LOCK_FILE
  missing = str(tmp_path / "missing_data")
  no_data = fault_config(**{"data.data_dir": str(tmp_path / "nowhere")})
  with pytest.raises(FileNotFoundError, match="nowhere"):
    trainer.train_and_evaluate(no_data, missing)
  assert not os.path.exists(os.path.join(missing, lock))

  def broken_model(config, data):
    raise ValueError("model.attention_kwargs: cannot build (injected)")

  unbuildable = str(tmp_path / "model_error")
  with monkeypatch.context() as m:
    m.setattr(train_state, "build_model", broken_model)
    with pytest.raises(ValueError, match="injected"):
      trainer.train_and_evaluate(rerun_config(), unbuildable, data=presence_task)
  assert not os.path.exists(os.path.join(unbuildable, lock))

  refused = _copy(finished, tmp_path)
  with pytest.raises(errors.ConfigMismatchError, match="seed: checkpoint 0, config 1"):
    trainer.train_and_evaluate(rerun_config(seed=1), refused, data=presence_task)
  assert not os.path.exists(os.path.join(refused, lock))
  trainer.train_and_evaluate(rerun_config(), refused, data=presence_task)   # not "in use"


# ----------------------------------------------------------------------------
# init_from, eval.py, signals while compiling.


@pytest.mark.slow
def test_init_from_checks_the_source_checkpoint_as_eval_does(finished, presence_task,
                                                             tmp_path):
  """A truncated source checkpoint, and one whose parameters do not match their CRC-32, are
  refused before anything is copied; an intact one is checked and used."""
  source = _copy(finished, tmp_path, "source")
  best, step = os.path.join(source, "checkpoints"), finished[1]["best_step"]
  params = _params(source, rerun_config(), presence_task, "best")
  chex.assert_trees_all_equal(saved_runs.load_run(source).params(), params)
  with open(os.path.join(best, str(step), "meta", "metadata")) as f:
    meta = json.load(f)
  assert meta["best_step"] == step and meta["params_crc32"] == run_guard.state_crc32(params)
  for damage, problem in (("crc", "its parameters do not match the CRC-32 saved with them"),
                          ("truncated", "")):
    # A fresh copy per damage: tensorstore caches what this process read from a path.
    source = _copy(finished, tmp_path, f"source_{damage}")
    best = os.path.join(source, "checkpoints")
    if damage == "crc":
      with open(os.path.join(best, str(step), "meta", "metadata"), "w") as f:
        json.dump({**meta, "params_crc32": meta["params_crc32"] ^ 1}, f)
    else:
      _truncate_arrays(os.path.join(best, str(step)))
    workdir = str(tmp_path / f"target_{damage}")
    with pytest.raises(errors.CheckpointError) as error:
      trainer.train_and_evaluate(rerun_config(init_from=source), workdir, data=presence_task)
    message = str(error.value)
    assert message.startswith(f"init_from={source!r}: damaged checkpoint {best}/{step}: "
                              f"{problem}"), message
    assert "\n" not in message and not os.path.exists(os.path.join(workdir, "transfer.json"))
    assert not os.path.exists(os.path.join(workdir, run_folder.LOCK_FILE))


def test_eval_with_another_tasks_config_names_the_task(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({"task": "listops"}))
  with pytest.raises(errors.ConfigMismatchError,
                     match=r"^--config is a config of task 'text', but .* trained task "
                           r"'listops' \(.*config.json\): pass a configs/listops/\.\.\. config"):
    final_test.evaluate_checkpoint(str(tmp_path), config=lra.make_config("text", "simple",
                                                                      "tiny"))


@pytest.fixture
def python_sigint():
  """SIGINT with Python's own handler during the test (a background process may inherit it
  ignored), put back after."""
  inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
  yield
  signal.signal(signal.SIGINT, inherited)


@pytest.mark.slow
def test_a_signal_while_precompiling_stops_as_a_preemption(presence_task, tmp_path,
                                                           monkeypatch, python_sigint):
  """SIGINT arrives while the compile threads run: they finish or are cancelled, and the run
  stops as a preempted one does (PreemptedError, exit 75 in train.py), with nothing trained
  and so nothing saved; before, a KeyboardInterrupt in the waiting thread could crash."""
  real = precompile._in_threads
  calls = []

  def signalled(thunks, workers, should_stop=None):
    calls.append(len(thunks))
    first = thunks[0]

    def send_then_compile():
      os.kill(os.getpid(), signal.SIGINT)
      return first()

    return real([send_then_compile] + thunks[1:], workers, should_stop)

  monkeypatch.setattr(precompile, "_in_threads", signalled)
  handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
  workdir = str(tmp_path / "run")
  with pytest.raises(preemption.PreemptedError) as error:
    trainer.train_and_evaluate(rerun_config(), workdir, data=presence_task,
                               precompile_workers=2)
  assert calls and (error.value.step, error.value.cause) == (0, "SIGINT")
  assert {s: signal.getsignal(s) for s in handlers} == handlers
  assert not os.path.exists(os.path.join(workdir, run_folder.LOCK_FILE))
  assert not os.path.exists(os.path.join(workdir, "checkpoints", "1"))
  assert _keys(workdir) == [] and not os.path.exists(os.path.join(workdir, "results.json"))


def test_a_stop_request_cancels_the_compilations_not_started():
  started = []

  def slow(i):
    def thunk():
      started.append(i)
      time.sleep(0.05)
      return i
    return thunk

  assert precompile._in_threads([slow(i) for i in range(4)], 2) == [0, 1, 2, 3]
  started.clear()
  with pytest.raises(precompile.Stopped):
    precompile._in_threads([slow(i) for i in range(50)], 1, should_stop=lambda: True)
  assert len(started) < 50, "every compilation ran although a stop was requested"


# ----------------------------------------------------------------------------
# Output: progress lines, abandoned reads, the scripts' one-line errors.


def test_progress_without_a_terminal_is_whole_lines(capsys, monkeypatch):
  monkeypatch.delenv("TQDM_DISABLE", raising=False)
  with progress.bar(total=4, desc="gen", unit="ex", interval=0.0) as bar:
    assert isinstance(bar, progress.LineProgress)   # pytest's stderr is not a terminal
    for _ in range(4):
      bar.update(1)
    bar.set_postfix(loss="1.5")
  err = capsys.readouterr().err
  assert "\r" not in err and err.splitlines()[0].startswith("gen: 1/4 (25%), ")
  assert err.splitlines()[-1].startswith("gen: 4/4 (100%), ") and "loss=1.5" in err
  monkeypatch.setenv("TQDM_DISABLE", "1")
  with progress.bar(total=4, desc="gen", interval=0.0) as bar:
    bar.update(4)
    bar.write("a message still shows")
  captured = capsys.readouterr()
  assert captured.err == "" and captured.out == "a message still shows\n"


def test_abandoned_reads_of_a_failed_restore_are_not_printed(monkeypatch):
  """What tensorstore reports when it posts a read's result after orbax closed its event loop
  (an unraisable ``RuntimeError`` raised in ``call_soon_threadsafe``) does not reach the hook
  that prints it; the same error raised elsewhere still does. The hook is installed as
  train.py installs it, inside its signal blocks, and still works after they end (a CI run
  printed one after its last line when the blocks put back the hook found on entry)."""
  reported = []
  monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(u.exc_value))
  with cli.sigterm_raises(), cli.sigint_raises():
    checkpoint_faults.quiet_abandoned_reads()
    checkpoint_faults.quiet_abandoned_reads()   # once only
  loop = asyncio.new_event_loop()
  loop.close()

  class PostsToAClosedLoop:
    def __del__(self):
      loop.call_soon_threadsafe(print)

  class FailsElsewhere:
    def __del__(self):
      raise RuntimeError("Event loop is closed")

  PostsToAClosedLoop()   # collected at once: Python reports __del__'s error as unraisable
  assert reported == []
  FailsElsewhere()
  assert [str(e) for e in reported] == ["Event loop is closed"]


def test_a_half_written_step_that_a_late_write_creates_again_is_removed(tmp_path):
  """tensorstore may finish a write of an abandoned save after orbax's threads ended and create
  the ``<step>.orbax-checkpoint-tmp`` folders again (a CI-load run left ``.../ocdbt.process_0/d``
  behind): a writer that does so 50 ms after the removal leaves nothing, and a step saved
  before stays."""
  partial = tmp_path / "2.orbax-checkpoint-tmp"
  (partial / "state").mkdir(parents=True)
  (tmp_path / "1").mkdir()
  manager = types.SimpleNamespace(directory=tmp_path)

  def late_write():
    while partial.exists():
      time.sleep(0.001)
    time.sleep(0.05)
    (partial / "state.orbax-checkpoint-tmp" / "ocdbt.process_0" / "d").mkdir(parents=True)

  writer = threading.Thread(target=late_write)
  writer.start()
  checkpoint_faults._remove_partial(manager, 2)   # pylint: disable=protected-access
  writer.join()
  assert sorted(os.listdir(tmp_path)) == ["1"]


def test_a_half_written_step_that_cannot_be_removed_is_left_at_once(tmp_path, monkeypatch):
  """A removal that fails for a reason other than a racing write (no write permission) is not
  tried again until :data:`checkpoint_faults.ABANDON_WAIT_SECONDS` pass: the run's one line
  comes at once."""
  (tmp_path / "2.orbax-checkpoint-tmp").mkdir()
  calls = []

  def refused(path, onerror):
    calls.append(path)
    onerror(os.rmdir, path, (PermissionError, PermissionError(13, "Permission denied"), None))

  monkeypatch.setattr(shutil, "rmtree", refused)
  start = time.monotonic()
  checkpoint_faults._remove_partial(   # pylint: disable=protected-access
      types.SimpleNamespace(directory=tmp_path), 2)
  assert len(calls) == 1 and time.monotonic() - start < 5.0


def test_what_a_signal_left_halfway_is_freed_quietly_before_the_last_line(monkeypatch):
  """A signal's exception raised while asyncio builds an event loop (a second SIGTERM during
  an orbax save) leaves a loop without its attributes, whose ``__del__`` fails, and a
  coroutine never awaited, both held by the traceback's frames. ``cli.release_interrupted``
  frees them inside the call (not when the ``except`` clause ends, after train.py's last line
  in a CI-load run) and reports neither; the hook and filters found on entry are back after."""
  reported, freed = [], []

  class HalfBuiltLoop(asyncio.SelectorEventLoop):
    def __init__(self):   # pylint: disable=super-init-not-called
      raise errors.Terminated("SIGTERM")

    def __del__(self):
      freed.append(True)
      super().__del__()   # asyncio's own: reads attributes __init__ never set

  async def save():
    pass

  def start_a_save():
    pending = save()   # pylint: disable=unused-variable
    HalfBuiltLoop()

  gc.collect()   # earlier tests' garbage first: its finalizers' warnings are not this call's
  monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(u.exc_value))
  try:
    start_a_save()
  except errors.Terminated as e:
    stopped = e
  with warnings.catch_warnings(record=True) as warned:
    warnings.simplefilter("always")
    cli.release_interrupted(stopped)
    assert freed == [True] and reported == [] and warned == [], (
        reported, [f"{w.category.__name__}: {w.message} ({w.filename})" for w in warned])
    async def unawaited():
      pass
    unawaited()   # outside the call: reported as before
    gc.collect()
  assert [str(w.message) for w in warned] == [
      f"coroutine '{unawaited.__qualname__}' was never awaited"]
  HalfBuiltLoop.__init__ = lambda self: None
  HalfBuiltLoop()
  assert freed == [True, True] and [type(e) for e in reported] == [AttributeError]


def test_sibling_writes_of_a_failed_save_are_not_logged_after_its_line(tmp_path):
  """asyncio's 'Task exception was never retrieved' of a write into a failed save's
  ``<step>.orbax-checkpoint-tmp`` folder (logged whenever the task is freed, after the save's
  one line in a CI run) is dropped once a manager exists; another task's error still shows."""
  checkpoints.checkpoint_manager(str(tmp_path / "checkpoints"), max_to_keep=1)
  seen = []

  class Keep(logging.Handler):
    def emit(self, record):
      seen.append(str(record.exc_info[1]))

  keep = Keep()
  logging.getLogger().addHandler(keep)
  try:
    for where in ("run/checkpoints/2.orbax-checkpoint-tmp/state/d/1: File too large",
                  "elsewhere: File too large"):
      async def write(where=where):
        raise ValueError(where)

      async def save():
        asyncio.ensure_future(write())   # never awaited, as gather leaves a failed sibling
        await asyncio.sleep(0.01)

      asyncio.run(save())
      gc.collect()
  finally:
    logging.getLogger().removeHandler(keep)
  assert seen == ["elsewhere: File too large"]


@pytest.mark.parametrize("raised", [KeyboardInterrupt, errors.Terminated, OSError])
def test_a_signal_inside_orbaxs_wait_is_not_logged_after_the_line(tmp_path, monkeypatch,
                                                                  raised):
  """A Ctrl-C or SIGTERM that lands inside ``CheckpointManager.wait_until_finished`` (as one
  sent when the best-validation test begins did, under CI load) is raised again by orbax,
  which first logs it with its traceback ("Save Finalize thread ... failed"): that record is
  dropped once a manager exists, as train.py reports the signal in one line; an ``OSError``
  there is still logged."""
  manager = checkpoints.checkpoint_manager(str(tmp_path / "checkpoints"), max_to_keep=1)
  seen = []

  class Keep(logging.Handler):
    def emit(self, record):
      seen.append(record.exc_info[0])

  def interrupted(*args):
    raise raised("signal")

  # pylint: disable-next=protected-access
  monkeypatch.setattr(manager._finalize_thread, "map", interrupted)
  keep = Keep()
  logging.getLogger().addHandler(keep)
  try:
    with pytest.raises(raised):
      manager.wait_until_finished()
  finally:
    logging.getLogger().removeHandler(keep)
    monkeypatch.undo()
    manager.close()
  assert seen == ([] if issubclass(raised, KeyboardInterrupt) else [raised])


def test_scripts_name_train_pys_one_line_error(tmp_path):
  log = str(tmp_path / "train.log")
  cause = ("ConfigMismatchError: runs/x/checkpoints/6 was computed with other settings: "
           "learning_rate: checkpoint 0.05, config 0.01.")
  program = f"import sys; print('step 1'); print('train.py: {cause}', file=sys.stderr); sys.exit(1)"
  with open(log, "w") as f:
    f.write("train.py: an older start's error\n")
  with pytest.raises(RuntimeError) as error:
    reporting.run_logged([sys.executable, "-c", program], ROOT, log, "seed 3")
  assert str(error.value) == f"seed 3: train.py exited 1: {cause}; see {log}"
  with pytest.raises(RuntimeError, match=r"^seed 3: train.py exited 2; see "):
    reporting.run_logged([sys.executable, "-c", "import sys; sys.exit(2)"], ROOT, log, "seed 3")


def test_seeds_refuses_a_copy_to_file_before_training(tmp_path):
  target = tmp_path / "summary.md"
  target.write_text("committed\n")
  root = tmp_path / "root"
  with pytest.raises(SystemExit, match=rf"^seeds.py: --copy_to {target}: {target} is a file, "
                                       r"not a folder"):
    seeds.main(["--config", "configs/listops/simple.py:tiny", "--seeds", "0",
                "--workdir_root", str(root), "--copy_to", str(target)])
  assert not root.exists() and target.read_text() == "committed\n"
  assert seeds.copy_target_problem(str(tmp_path / "new" / "folder")) is None


def test_a_lone_surrogate_in_a_text_line_names_the_file_and_line(tmp_path):
  path = tmp_path / "train.jsonl"
  path.write_text('{"text": "fine", "label": 1}\n{"text": "cut \\ud83d here", "label": 0}\n')
  with pytest.raises(ValueError, match=rf"^{path}:2: field 'text' holds '\\ud83d' at "
                                       r"character 4, a lone UTF-16 surrogate"):
    text.read_jsonl(str(path))


@pytest.mark.slow
def test_train_py_refuses_cli_mistakes_in_one_line(tmp_path):
  """Two mistakes that need the real command line: a workdir name that is not UTF-8 (bytes
  in sys.argv) and a stray positional argument. No JAX work is done for either."""
  common = [sys.executable, "train.py", "--config", "configs/listops/simple.py:tiny"]
  bad_name = os.fsencode(str(tmp_path)) + b"/run\xff"
  proc = subprocess.run(common + [b"--workdir=" + bad_name], cwd=ROOT, capture_output=True,
                        timeout=300)
  err = proc.stderr.decode("utf-8", "replace")
  assert proc.returncode == 1 and "Traceback" not in err, err[-2000:]
  assert err.strip().splitlines()[-1].startswith("train.py: --workdir ") and "b'\\xff'" in err
  assert os.listdir(tmp_path) == []
  proc = subprocess.run(common + ["stray"], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1] == (
      "train.py: unexpected argument(s) 'stray': train.py takes flags only, as --name=value "
      "(quote a value that holds spaces or brackets, e.g. --config.freeze=\"('^encoder/',)\"); "
      "see --help"), proc.stderr[-2000:]
  assert len(proc.stderr.splitlines()) < 10, "absl's help was printed"


_WITH_SIGINT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                "os.execv(sys.executable, [sys.executable] + sys.argv[1:])")


@pytest.mark.slow
def test_train_py_ctrl_c_while_precompiling_exits_cleanly(tmp_path):
  """Ctrl-C during the start-up compile of a grouped run with ``--precompile_workers=2`` (a
  segmentation fault in issue 48's probe): once, the run stops as a preempted one (status 75);
  twice, at once, without saving (status 130). One line, no traceback, no crash, no lock."""
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  command = [sys.executable, "train.py", "--config", "configs/listops/simple.py:tiny",
             f"--config.data.cache_dir={tmp_path / 'cache'}", "--config.data.num_train=64",
             "--config.data.num_val=32", "--config.data.num_test=32",
             "--config.model.num_layers=1", "--config.num_train_steps=4",
             "--config.data.group_by_length=True", "--precompile_workers=2",
             "--xla_cache_dir="]   # nothing cached: the compile takes seconds
  endings = {}
  for name, signals in (("once", 1), ("twice", 2)):
    workdir = tmp_path / name
    # A process started in the background may inherit SIGINT ignored: the child puts the
    # default back and becomes train.py (exec keeps it), as a terminal's Ctrl-C would find it.
    proc = subprocess.Popen([sys.executable, "-c", _WITH_SIGINT] + command[1:]
                            + [f"--workdir={workdir}"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
      started = time.time()
      while not (workdir / "parameter_overview.txt").exists():   # written just before
        assert proc.poll() is None and time.time() - started < 300, proc.communicate()[1]
        time.sleep(0.02)
      # Python runs its handler once for signals that arrive before the main thread gets
      # back to bytecode, so the second Ctrl-C goes after the first one's message, as a
      # user presses it after reading the line.
      lines = []
      reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
      reader.start()
      proc.send_signal(signal.SIGINT)
      if signals == 2:
        while not any(line.startswith("SIGINT received") for line in list(lines)):
          assert proc.poll() is None and time.time() - started < 300, "".join(lines)
          time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
      proc.wait(timeout=300)
      reader.join(timeout=60)
      err = "".join(lines)
    finally:
      if proc.poll() is None:
        proc.kill()
    for crash in ("Traceback", "Fatal Python error", "FATAL", "Segmentation fault"):
      assert crash not in err, err[-3000:]
    assert not (workdir / run_folder.LOCK_FILE).exists()
    endings[name] = (proc.returncode, err.strip().splitlines()[-1])
  assert endings["once"][0] == preemption.PREEMPTED_EXIT_CODE, endings
  assert endings["once"][1].startswith("train.py: preempted at step "), endings
  assert endings["twice"] == (130, "train.py: interrupted (SIGINT) before the run could save; "
                              "the last checkpoint stays: rerun the same command to continue "
                              "from it"), endings
