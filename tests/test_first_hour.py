"""Issue 63, items 3 to 7: the rough edges a new user meets, each run as a user would run the
command (a subprocess), with its exit status and the first line of its message checked.

Most commands stop at their check, before any data or compilation, in seconds (mostly Python's
and absl's start-up). The slow ones train a :tiny model for a few steps on a little generated
ListOps (W&B's failed start, SIGTERM while generating and during the final test, seeds.py's
progress); the rehearsal of a paper cell runs in CI's paper-cells step.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, SMALL_LISTOPS

TINY = ("--config", "configs/listops/simple.py:tiny")


def _run(*args, env=None, timeout=300):
  """Runs ``python <args>`` in the repository root; returns the finished process."""
  return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=timeout, env={**os.environ, **(env or {})})


def _first_line(proc) -> str:
  """The first line of stderr (where the one-line errors go)."""
  lines = proc.stderr.strip().splitlines()
  return lines[0] if lines else ""


def _assert_one_line(proc, prefix, *parts, status=1):
  """Exit ``status``, stderr's first line starts with ``prefix`` and holds each of ``parts``,
  and no traceback."""
  first = _first_line(proc)
  assert proc.returncode == status, (proc.returncode, proc.stderr[-2000:])
  assert first.startswith(prefix), proc.stderr[-2000:]
  for part in parts:
    assert part in first, first
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


# ----------------------------------------------------------------------------
# Overrides: the bad one is named alone.


def test_unknown_override_names_only_the_bad_one(tmp_path):
  proc = _run("train.py", *TINY, "--workdir", str(tmp_path / "run"), "--config.seed=3",
              "--config.model.nope=1", "--config.num_train_steps=2")
  _assert_one_line(proc, "train.py: --config.model.nope: the config has no field 'nope' in "
                   "'model'")
  first = _first_line(proc)
  assert "--config.seed" not in first and "--config.num_train_steps" not in first, first
  assert not (tmp_path / "run").exists()


def test_misspelt_override_suggests_the_field(tmp_path):
  proc = _run("train.py", *TINY, "--workdir", str(tmp_path / "run"), "--config.seed=3",
              "--config.batch_sise=8")
  _assert_one_line(proc, "train.py: --config.batch_sise: the config has no field 'batch_sise'",
                   "did you mean 'batch_size'")
  assert "--config.seed" not in _first_line(proc)


def test_eval_overrides_without_config(tmp_path):
  proc = _run("eval.py", "--workdir", str(tmp_path / "run"), "--config.seed=2")
  _assert_one_line(proc, "eval.py: --config.seed needs --config", "config.json")
  assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------
# Config checks and workdirs that cannot be folders.


@pytest.mark.parametrize("field", ["num_eval_steps", "num_test_steps"])
def test_zero_evaluation_steps_are_refused(tmp_path, field):
  proc = _run("train.py", *TINY, "--workdir", str(tmp_path / "run"), f"--config.{field}=0")
  _assert_one_line(proc, f"train.py: {field}=0 would evaluate no batch", "-1 for the whole "
                   "split")
  assert not (tmp_path / "run").exists(), "refused before the workdir is made"


@pytest.mark.parametrize("below", ["", "run"])
def test_workdir_symlink_to_a_missing_folder_is_named(tmp_path, below):
  link = tmp_path / "link"
  link.symlink_to(tmp_path / "missing")
  workdir = os.path.join(str(link), below) if below else str(link)
  proc = _run("train.py", *TINY, "--workdir", workdir)
  _assert_one_line(proc, "train.py: --workdir", f"{link} is a symbolic link to",
                   "missing', which does not exist")
  assert not (tmp_path / "missing").exists()


def test_workdir_under_a_file(tmp_path):
  (tmp_path / "X").write_text("a file")
  proc = _run("train.py", *TINY, "--workdir", str(tmp_path / "X" / "run"))
  _assert_one_line(proc, "train.py: --workdir", f"{tmp_path / 'X'} is a file")


def test_seeds_workdir_root_under_a_file(tmp_path):
  (tmp_path / "X").write_text("a file")
  proc = _run("scripts/seeds.py", *TINY, "--seeds", "0", "--workdir_root",
              str(tmp_path / "X" / "sub"), "--config.num_train_steps=2")
  _assert_one_line(proc, "seeds.py: --workdir_root", f"{tmp_path / 'X'} is a file")


# ----------------------------------------------------------------------------
# One flag style: underscores; the dashed spelling is a deprecated alias; plain --help.


def test_dashed_flag_is_a_deprecated_alias(tmp_path):
  (tmp_path / "X").write_text("a file")
  proc = _run("scripts/seeds.py", *TINY, "--seeds", "0", "--workdir-root",
              str(tmp_path / "X" / "sub"))
  assert proc.returncode == 1, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert lines[0].startswith("seeds.py: --workdir-root is deprecated: write --workdir_root")
  assert lines[1].startswith("seeds.py: --workdir_root"), "the alias reached the flag"


@pytest.mark.parametrize("argv,first", [
    (("scripts/seeds.py",), "seeds.py: the following arguments are required: --config"),
    (("scripts/seeds.py", *TINY, "--seeds", "a"), "seeds.py: argument --seeds: invalid int "
     "value: 'a'"),
    (("scripts/compare.py",), "compare.py: the following arguments are required: folder"),
    (("scripts/reproduce.py", "listops_simple", "--workdir"), "reproduce.py: argument "
     "--workdir: expected one argument"),
    (("scripts/variant_table.py", "--steps", "x"), "variant_table.py: argument --steps: "
     "invalid int value: 'x'"),
])
def test_a_bad_invocation_is_one_line_and_status_1(argv, first):
  proc = _run(*argv)
  _assert_one_line(proc, first, "(see --help)")
  assert len(proc.stderr.strip().splitlines()) == 1, "no usage block before the error"


def test_spt_dashed_spellings_parse_as_the_underscored_ones(capsys):
  spt = _load_script("spt")
  dashed = spt.parse_args(["--spt-steps", "4", "--ft-steps=6", "--workdir-root", "/tmp/r",
                           "--table-only", "--spt-config.learning_rate=0.01",
                           "--config.seed=1"])
  notes = capsys.readouterr().err.splitlines()
  underscored = spt.parse_args(["--spt_steps", "4", "--ft_steps=6", "--workdir_root", "/tmp/r",
                                "--table_only", "--spt_config.learning_rate=0.01",
                                "--config.seed=1"])
  assert vars(dashed) == vars(underscored)
  assert underscored.spt_overrides == ["--config.learning_rate=0.01"]
  assert capsys.readouterr().err == "", "the underscored spelling draws no note"
  assert len(notes) == 5 and all("is deprecated: write --" in n for n in notes), notes


def _load_script(name):
  """``scripts/<name>.py`` as a module."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts",
                                                                   f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize("program", ["train.py", "eval.py", "scripts/seeds.py",
                                     "scripts/compare.py", "scripts/reproduce.py",
                                     "scripts/spt.py", "scripts/variant_table.py"])
def test_help_is_plain_text(program):
  proc = _run(program, "--help")
  # absl's --help (train.py, eval.py) exits with status 1 after printing; argparse's with 0.
  assert proc.returncode == (1 if program in ("train.py", "eval.py") else 0), proc.stderr
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert "``" not in proc.stdout and ":func:`" not in proc.stdout, proc.stdout
  names = re.findall(r"^\s+(?:-\w, )?--(?:\[no\])?([\w-]+)", proc.stdout, re.M)
  assert "help" in names or "config" in names, proc.stdout
  assert not [n for n in names if "-" in n], "flags are spelled with underscores"


# ----------------------------------------------------------------------------
# A failed start leaves no partial run folder.


@pytest.mark.slow   # generates a little ListOps and starts the run's logs (about 15 s)
def test_wandb_without_api_key_leaves_no_run_folder(tmp_path):
  pytest.importorskip("wandb")
  env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
  env.update(HOME=str(tmp_path / "home"), NETRC=str(tmp_path / "home" / "netrc"))
  root = tmp_path / "runs"
  proc = subprocess.run(
      [sys.executable, "train.py", *TINY, "--workdir", str(root / "run"),
       "--config.wandb.project=p", *SMALL_LISTOPS, "--config.num_train_steps=2"],
      cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
  assert proc.returncode == 1, proc.stderr[-2000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("train.py: StartError: could not start the W&B run"), last
  assert "was removed" in last, last
  assert not (root / "run").exists()
  # compare.py then finds no run there, rather than one it must leave out.
  proc = _run("scripts/compare.py", str(root), "--no_plot")
  assert proc.returncode == 1 and "left out" not in proc.stderr, proc.stderr
  assert _first_line(proc).startswith("compare.py: no finished run"), proc.stderr


# ----------------------------------------------------------------------------
# A missing optional dependency: one line, exit 1.


def test_explain_without_matplotlib(tmp_path):
  fake = tmp_path / "site" / "matplotlib"
  fake.mkdir(parents=True)
  (fake / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
  proc = _run("scripts/explain.py", "--workdir", str(tmp_path / "run"),
              env={"PYTHONPATH": str(tmp_path / "site")})
  _assert_one_line(proc, "explain.py: matplotlib cannot be imported", 'pip install -e ".[bench]"')


# ----------------------------------------------------------------------------
# The software stack on a GPU (faked here: the suite runs on CPUs).


def test_gpu_software_reads_cuda_cudnn_and_driver(tmp_path, monkeypatch):
  import types  # pylint: disable=import-outside-toplevel
  from jax._src import lib as jax_lib  # pylint: disable=import-outside-toplevel
  from simpletron_jax.run import software_record  # pylint: disable=import-outside-toplevel
  fake = types.SimpleNamespace(cuda_runtime_get_version=lambda: 12040,
                               cudnn_get_version=lambda: 90100,
                               cuda_driver_get_version=lambda: 12080)
  monkeypatch.setattr(jax_lib, "cuda_versions", fake, raising=False)
  smi = tmp_path / "bin" / "nvidia-smi"
  smi.parent.mkdir()
  smi.write_text("#!/bin/sh\necho 550.54.15\n")
  smi.chmod(0o755)
  monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
  record = software_record.gpu_software("gpu")
  assert record == {"cuda_version": "12.4", "cudnn_version": "9.1.0",
                    "cuda_driver_version": "12.8", "nvidia_driver_version": "550.54.15"}
  line = software_record.software_line({"python_version": "3.11", **record})
  assert line.endswith("CUDA 12.4, cuDNN 9.1.0, CUDA driver API 12.8, NVIDIA driver 550.54.15")
  # Off a GPU, or where nothing can be read, every field is None and nothing raises.
  assert set(software_record.gpu_software("cpu").values()) == {None}
  monkeypatch.setattr(jax_lib, "cuda_versions", None, raising=False)
  monkeypatch.setenv("PATH", str(tmp_path / "empty"))
  assert set(software_record.gpu_software("gpu").values()) == {None}


# ----------------------------------------------------------------------------
# SIGTERM where the run's preemption guard is not installed.


def _children(pid: int) -> list[int]:
  """The processes whose parent is ``pid`` (Linux /proc)."""
  found = []
  for name in os.listdir("/proc"):
    try:
      with open(f"/proc/{name}/stat", encoding="utf-8") as f:
        if name.isdigit() and int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
          found.append(int(name))
    except (OSError, ValueError, IndexError):
      continue
  return found


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    return False


def _wait_for(condition, proc, seconds=300):
  started = time.time()
  while not condition():
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    assert time.time() - started < seconds, "timed out"
    time.sleep(0.05)


@pytest.mark.slow   # generates ListOps with two worker processes (about 15 s)
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_sigterm_while_generating_listops(tmp_path):
  cache = tmp_path / "cache"
  proc = subprocess.Popen(
      [sys.executable, "train.py", *TINY, "--workdir", str(tmp_path / "run"),
       f"--config.data.cache_dir={cache}", "--config.data.num_train=30000"],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    _wait_for(lambda: list(cache.glob("listops/*/*.tmp")) and len(_children(proc.pid)) >= 3,
              proc)   # the resource tracker and two workers, and a file being written
    children = _children(proc.pid)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 143, err[-3000:]
  last = err.strip().splitlines()[-1]
  assert last.startswith("train.py: SIGTERM before the run's first checkpoint: nothing was "
                         "saved"), err[-3000:]
  assert "Traceback" not in err, err[-3000:]
  deadline = time.time() + 10
  while any(_alive(pid) for pid in children) and time.time() < deadline:
    time.sleep(0.1)
  assert not [pid for pid in children if _alive(pid)], "a generator process outlived train.py"
  assert not list(cache.glob("**/*.tmp")), "a half-written file was left in the cache"


@pytest.mark.slow   # a 2-step run, then a test long enough to be interrupted (~25 s)
def test_sigterm_during_the_final_test_saves_and_says_so(tmp_path):
  workdir = tmp_path / "run"
  # 2,000 short test examples in batches of 2: a test of about 1,000 batches (seconds).
  proc = subprocess.Popen(
      [sys.executable, "train.py", *TINY, "--workdir", str(workdir),
       f"--config.data.cache_dir={tmp_path / 'cache'}", "--config.data.num_train=64",
       "--config.data.num_val=32", "--config.data.num_test=2000", "--config.data.min_tokens=5",
       "--config.data.max_tokens=40", "--config.eval_batch_size=2",
       "--config.model.num_layers=1", "--config.num_train_steps=2",
       "--config.eval_frequency=2"],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:   # the last step's checkpoint is in place: the guard is off, the test is next
    _wait_for(lambda: (workdir / "checkpoints" / "2").is_dir(), proc)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 75, err[-3000:]
  assert err.strip().splitlines()[-1] == (
      f"train.py: SIGTERM during the final test: the trained run is saved (step 2 in "
      f"{workdir / 'checkpoints'}), and no results.json is written yet; rerun the same "
      "command to test it"), err[-3000:]
  assert "Traceback" not in err, err[-3000:]
  assert not (workdir / "run.lock").exists() and not (workdir / "results.json").exists()


# ----------------------------------------------------------------------------
# scripts/reproduce.py --rehearse: a paper cell's path on a CPU, never read as a result.


def test_rehearse_refuses_copy_to(tmp_path):
  proc = _run("scripts/reproduce.py", "listops_simple", "--rehearse", "--copy_to",
              str(tmp_path / "results"))
  _assert_one_line(proc, "reproduce.py: --copy_to copies a result; a --rehearse run is not one")
  assert not (tmp_path / "results").exists()


@pytest.mark.paper_cells   # CI's second step: a 4-step :tiny_lra_code run (about 40 s)
def test_rehearsal_of_a_final_step_cell_is_marked_and_records_its_flags(tmp_path):
  workdir = tmp_path / "rehearsal"
  proc = _run("scripts/reproduce.py", "listops_transformer_lra_code", "--rehearse",
              "--workdir", str(workdir), f"--config.data.cache_dir={tmp_path / 'cache'}",
              timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(workdir / "reproduce.json", encoding="utf-8") as f:
    record = json.load(f)
  assert record["rehearsal"] is True and record["config"].endswith(":tiny_lra_code")
  assert record["row"]["label"] == "listops_transformer_lra_code (rehearsal, not a result)"
  assert record["row"]["published"] is None and record["row"]["gap"] is None
  # The flags as they ran: one validation at the rehearsal's last step (4), not the cell's.
  frequencies = [f for f in record["flags"] if f.startswith("--config.eval_frequency=")]
  assert frequencies[-1] == "--config.eval_frequency=4", record["flags"]
  with open(workdir / "config.json", encoding="utf-8") as f:
    config = json.load(f)
  assert (config["eval_frequency"], config["num_train_steps"]) == (4, 4)
  text = (workdir / "comparison.md").read_text()
  assert "**Rehearsal, not a result**" in text and "36.37" not in text
  assert "| listops_transformer_lra_code (rehearsal, not a result) |" in text


# ----------------------------------------------------------------------------
# scripts/seeds.py: each seed's progress while it trains; a signal reaches train.py once.


@pytest.mark.slow   # one seed, stopped in its loop (about 25 s)
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_seeds_relays_progress_and_passes_sigterm_on_to_train_py(tmp_path):
  root = tmp_path / "seeds"
  proc = subprocess.Popen(
      [sys.executable, "scripts/seeds.py", *TINY, "--seeds", "0", "--workdir_root", str(root),
       *SMALL_LISTOPS, f"--config.data.cache_dir={tmp_path / 'cache'}",   # relays generating
       "--config.num_train_steps=100000", "--config.log_every=1"],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env={**os.environ, "SIMPLETRON_PROGRESS_SECONDS": "0.5"})
  metrics, log = root / "seed0" / "metrics.jsonl", root / "seed0" / "train.log"

  def trained_a_while():
    # seeds.py writes each line to train.log before it relays it: the second progress line
    # of the loop in the log means the first was relayed (no fixed wait needed).
    return (metrics.exists() and metrics.read_text().count('"split": "train"') >= 3
            and len(re.findall(r"^train: \d+/100000 \(", log.read_text(), re.M)) >= 2)

  try:   # a few progress lines, then SIGTERM
    _wait_for(trained_a_while, proc)
    children = _children(proc.pid)
    proc.send_signal(signal.SIGTERM)   # to seeds.py alone: train.py is in its own session
    out, err = proc.communicate(timeout=300)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 75, err[-3000:]
  assert err.strip().splitlines()[-1].startswith(
      "seeds.py: seed 0: train.py was preempted (SIGTERM or SIGINT) after saving a checkpoint; "
      "rerun the same command to continue"), err[-3000:]
  assert "seed 0: SIGTERM passed on to train.py" in out
  # While it trained, its progress came through (the parameter table stays in train.log).
  lines = out.splitlines()
  assert any(re.match(r"seed 0: ListOps examples: \d+/128 ", l) for l in lines), out
  assert any(re.match(r"seed 0: train: \d+/100000 \(", l) for l in lines), out
  assert any(l.startswith("seed 0: train.py: preempted at step ") for l in lines), out
  assert not any("| encoder/" in l for l in lines)
  text = log.read_text()
  assert "| encoder/" in text and "preempted at step" in text
  assert not [pid for pid in children if _alive(pid)], "train.py outlived seeds.py"
  assert [n for n in os.listdir(root / "seed0" / "checkpoints") if n.isdigit()]
