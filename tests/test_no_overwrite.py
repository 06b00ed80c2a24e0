"""Results never go stale and never overwrite (issue 47, item 2).

* A script that reuses a finished run checks its config fingerprint and step count
  (``run_record.workdir_results_problem`` with the config): ``variant_table.py`` run with
  ``--steps 20`` then ``--steps 40`` trains again the second time and reports 40 steps;
  ``spt.py`` tabulates only runs of its own configs.
* Every script writes under ``runs/`` (or ``--out``) by default; the committed ``results/``
  and ``benchmarks/results/`` change only through an explicit ``--copy_to`` (or, for
  benchmarks, ``--out``). The benchmarks' ``--quick`` modes run here, the experiments' in
  ``tests/test_experiments.py`` (from a scratch working directory), and ``git status`` of
  ``results/`` and ``benchmarks/results/`` must be the same after them
  (:func:`committed_unchanged`); no script's output flag defaults to a committed folder.
"""

from __future__ import annotations

import ast
import glob
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from simpletron_jax.runtime import overrides
from simpletron_jax.run import run_record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITTED = ("results", os.path.join("benchmarks", "results"))


def _load(path: str, name: str):
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, path))
  module = importlib.util.module_from_spec(spec)
  sys.path.insert(0, os.path.dirname(os.path.join(ROOT, path)))
  # Registered while it runs: dataclasses look their module up in sys.modules (without it the
  # test passed only when another test had imported a module of the same name first).
  saved = sys.modules.get(name)
  sys.modules[name] = module
  try:
    spec.loader.exec_module(module)
  finally:
    sys.path.pop(0)
    if saved is None:
      del sys.modules[name]
    else:
      sys.modules[name] = saved
  return module


def _committed_status() -> set[str]:
  """``git status`` lines (changes and new files) under the committed result folders."""
  out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--",
                        *COMMITTED], cwd=ROOT, capture_output=True, text=True, check=False)
  if out.returncode:
    pytest.skip(f"not a git checkout: {out.stderr.strip()}")
  return set(out.stdout.splitlines())


@pytest.fixture
def committed_unchanged():
  """Fails the test when it changed or added a file under ``results/`` or
  ``benchmarks/results/`` (only those paths are compared: other files of the tree may be
  edited meanwhile)."""
  before = _committed_status()
  yield
  assert _committed_status() == before


# ----------------------------------------------------------------------------
# variant_table.py: 20 steps, then 40.


def _fake_train(calls: list):
  """A train.py stand-in: the config it would train (the command's --config and overrides,
  parsed as train.py parses them) and the files the trainer writes, with that config's
  fingerprint."""
  def train_for(core):
    def train(cmd, workdir, name):
      spec = cmd[cmd.index("--config") + 1]
      config = overrides.load_config(spec, [a for a in cmd if a.startswith("--config.")])
      steps = config.num_train_steps
      calls.append((name, steps))
      results = {"complete": True, "final_step": steps, "num_train_steps": steps,
                 "config_fingerprint": run_record.config_fingerprint(config),
                 "test_accuracy": steps / 1000, "test_accuracy_best_val": steps / 1000,
                 "test_accuracy_final": steps / 1000, "best_val_accuracy": 0.5,
                 "best_step": steps, "steps_per_sec": 1.0, "train_seconds": 60.0}
      for file, content in (("results.json", results), ("config.json", config.to_dict())):
        with open(os.path.join(workdir, file), "w") as f:
          json.dump(content, f, default=str)
      open(os.path.join(workdir, "metrics.jsonl"), "w").close()
    return train
  return train_for


def test_variant_table_trains_again_when_the_settings_change(tmp_path, capsys,
                                                             committed_unchanged):
  vt = _load("scripts/variant_table.py", "variant_table")
  calls = []
  base = ["--task", "listops", "--variant", "tiny", "--names", "simple", "--eval_every", "10",
          "--warmup", "5", "--runs", str(tmp_path / "runs")]
  first = vt.main([*base, "--steps", "20"], train_for=_fake_train(calls))
  assert calls == [("simple", 20)] and first["results"]["simple"]["final_step"] == 20
  second = vt.main([*base, "--steps", "40"], train_for=_fake_train(calls))
  assert calls == [("simple", 20), ("simple", 40)]   # not the 20-step result again
  assert second["results"]["simple"]["final_step"] == 40
  assert "not reused: " in capsys.readouterr().out   # and says why
  with open(tmp_path / "runs" / "table.md") as f:
    row = f.read().splitlines()[2]
  assert "| 4.0 |" in row and "--config.num_train_steps=40" in row
  vt.main([*base, "--steps", "40"], train_for=_fake_train(calls))
  assert len(calls) == 2                              # the same settings: reused
  vt.main([*base, "--steps", "40", "--config.model.dropout_rate=0.2"],
          train_for=_fake_train(calls))
  assert calls[-1] == ("simple", 40) and len(calls) == 3   # another config fingerprint
  # The table stays in the runs folder; --copy_to is what copies it out.
  assert sorted(os.listdir(tmp_path / "runs")) == ["simple", "table.json", "table.md"]
  vt.main([*base, "--steps", "40", "--config.model.dropout_rate=0.2", "--copy_to",
           str(tmp_path / "copy")], train_for=_fake_train(calls))
  assert len(calls) == 3
  assert sorted(os.listdir(tmp_path / "copy")) == ["simple", "table.json", "table.md"]
  assert sorted(os.listdir(tmp_path / "copy" / "simple")) == ["config.json", "metrics.jsonl",
                                                              "results.json"]
  with pytest.raises(ValueError, match="no field 'model.dropout'"):
    vt.main([*base, "--config.model.dropout=0.2"], train_for=_fake_train(calls))
  assert len(calls) == 3


def test_variant_table_writes_under_runs_by_default():
  vt = _load("scripts/variant_table.py", "variant_table")
  args = vt.parse_args(["--task", "text", "--config.data.val_fraction", "0"])
  assert args.runs is None and args.copy_to is None
  assert args.config_overrides == ["--config.data.val_fraction=0"]


# ----------------------------------------------------------------------------
# spt.py: only runs of its own configs are tabulated.


def test_spt_table_leaves_out_runs_of_other_settings(tmp_path):
  spt = _load("scripts/spt.py", "spt_script")
  root = str(tmp_path / "root")
  argv = ["--tasks", "listops", "--attentions", "linear", "--seeds", "0", "--size", "tiny",
          "--spt_steps", "4", "--ft_steps", "6", "--workdir_root", root,
          "--config.num_eval_steps=2", "--spt_config.learning_rate=0.001"]
  args = spt.parse_args(argv)
  for stage in spt.STAGES:
    config = spt.run_config(args, "listops", "linear", 0, stage, root)
    workdir = os.path.join(root, "listops_linear", "seed0", stage)
    os.makedirs(workdir)
    steps = config.num_train_steps
    results = {"complete": True, "final_step": steps, "num_train_steps": steps,
               "config_fingerprint": run_record.config_fingerprint(config),
               "test_accuracy": 0.3, "test_accuracy_final": 0.3,
               "test_accuracy_best_val": 0.3, "best_val_accuracy": 0.3}
    with open(os.path.join(workdir, "results.json"), "w") as f:
      json.dump(results, f)
    with open(os.path.join(workdir, "config.json"), "w") as f:
      json.dump({"init_from": config.init_from}, f)
    assert spt.run_problem(workdir, config) is None
  table = spt.write_table(root, args)
  assert table["rows"][0]["seeds"] == [0] and table["left_out"] == []
  # The same folder under other settings: its runs do not count, and the table says why.
  other = spt.parse_args([*argv[:-1], "--spt_config.learning_rate=0.01"])
  table = spt.write_table(root, other)
  assert table["rows"][0]["seeds"] == []
  assert len(table["left_out"]) == 1 and "another config" in table["left_out"][0]
  longer = spt.parse_args([a if a != "6" else "8" for a in argv])
  assert "trains 8 steps" in spt.write_table(root, longer)["left_out"][0]
  # A copied folder still tabulates: a fine-tuning run is compared with its own init_from.
  copy = str(tmp_path / "copy")
  spt.copy_out(root, copy)
  at = argv.index("--workdir_root") + 1
  assert spt.write_table(copy, spt.parse_args([*argv[:at], copy, *argv[at + 1:]]))["rows"][0][
      "seeds"] == [0]


# ----------------------------------------------------------------------------
# --quick modes from a scratch working directory: nothing under results/ changes.


def test_benchmark_quick_modes_write_under_runs(tmp_path, monkeypatch, committed_unchanged):
  # speed_memory --quick on a cell that fails validation at once: it still writes its outputs.
  sm = _load("benchmarks/speed_memory.py", "speed_memory")
  monkeypatch.setattr(sm, "ROOT", str(tmp_path))
  with pytest.raises(SystemExit, match="no cell ran"):
    sm.main(["--quick", "--variants", "linformer", "--lengths", "32", "--steps", "1",
             "--rounds", "1", "--matmul_n", "64", "--cache_dir", "", "--set",
             "length_multiple=8"])
  assert glob.glob(str(tmp_path / "runs" / "benchmarks" / "*" / "speed_memory.md"))
  assert not (tmp_path / "benchmarks" / "results").exists()


def _output_defaults(path: str) -> list[str]:
  """The source text of every ``default=`` of an output-like flag (``--out``, ``--runs``,
  ``--workdir_root``, ``--copy_to``, or their former dashed spelling) and of module-level
  ``OUT`` constants in a script."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and (
        node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in (
            "--out", "--runs", "--workdir-root", "--copy-to", "--workdir_root", "--copy_to")):
      found += [ast.unparse(k.value) for k in node.keywords if k.arg == "default"]
    if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "OUT" for t in node.targets):
      found.append(ast.unparse(node.value))
  return found


def test_no_script_defaults_to_a_committed_folder():
  scripts = sorted(glob.glob(os.path.join(ROOT, "scripts", "**", "*.py"), recursive=True)
                   + glob.glob(os.path.join(ROOT, "benchmarks", "*.py")))
  checked = {}
  for path in scripts:
    for default in _output_defaults(path):
      checked[f"{os.path.relpath(path, ROOT)}: {default}"] = (
          "'results'" in default or "results/" in default or "'results')" in default)
  assert len(checked) >= 8
  assert [k for k, bad in checked.items() if bad] == []
