"""Training, evaluation and every entry point run without TensorFlow (issue 43).

The GPU machines the project rents have no TensorFlow and no tensorflow-datasets. Here both
are installed (the ``test`` extra has them, for the tfds reader tests), so each subprocess
below gets a ``sitecustomize`` that hides both from Python's path finder: ``import
tensorflow`` raises ``ModuleNotFoundError`` and ``importlib.util.find_spec("tensorflow")``
returns None (etils checks that), as where they are not installed.

* ``train.py`` on tiny ListOps exits 0, writes ``results.json``, and TensorBoard's own
  reader gets back every scalar of ``metrics.jsonl`` (as float32) at its step; ``eval.py``
  then scores the checkpoint.
* Every module the entry points (``train.py``, ``eval.py``, ``scripts/``, ``benchmarks/``)
  and the package import, at the top or inside a function, imports, except the two blocked
  ones and optional modules not installed (LRA's own code, which ``scripts/lra_golden.py``
  reads from a checkout; the ``torch`` extra).
* Reading a tfds copy without tensorflow-datasets, or a tfrecord copy without TensorFlow, is
  one line naming the ``tfds`` extra.
"""

import ast
import glob
import json
import math
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from simpletron_jax.data import tfds_io
from simpletron_jax.runtime import errors
from tests.conftest import ROOT, SMALL_LISTOPS

BLOCKED = ("tensorflow", "tensorflow_datasets")
# Imported by some entry points but in no core dependency: LRA's code and the flax of its day
# (scripts/lra_golden.py runs in an environment of its own), and the extras: ``torch``
# (benchmarks/torch_step.py), ``bench`` (matplotlib), ``wandb``.
OPTIONAL = ("lra_benchmarks", "flax.deprecated", "torch", "transformers", "matplotlib", "wandb")
# Entry-point neighbours that import one of those at the top.
_NEEDS_OPTIONAL = ("torch_step",)

_SITECUSTOMIZE = f'''"""Hides {BLOCKED} (tests/test_no_tensorflow.py): Python's path
finder is wrapped so that it finds neither them nor their distributions, as where they are not
installed (``import`` raises ModuleNotFoundError, ``importlib.util.find_spec`` returns None)."""
import sys
from importlib.machinery import PathFinder

_HIDDEN = {BLOCKED!r}
_HIDDEN_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow_cpu",
                         "tensorflow-datasets", "tensorflow_datasets")


class _PathFinderWithout:
  @classmethod
  def find_spec(cls, name, path=None, target=None):
    if name.split(".")[0] in _HIDDEN:
      return None
    return PathFinder.find_spec(name, path, target)

  @classmethod
  def find_distributions(cls, *args, **kwargs):
    return (d for d in PathFinder.find_distributions(*args, **kwargs)
            if (d.metadata["Name"] or "").lower() not in _HIDDEN_DISTRIBUTIONS)

  @classmethod
  def invalidate_caches(cls):
    PathFinder.invalidate_caches()


sys.meta_path[:] = [_PathFinderWithout if f is PathFinder else f for f in sys.meta_path]
'''

SMALL = [*SMALL_LISTOPS, "--config.eval_frequency=2", "--config.num_train_steps=4",
         "--config.warmup=2", "--config.checkpoint_every=2"]


@pytest.fixture(scope="module")
def no_tf_env(tmp_path_factory):
  """The environment of a subprocess in which TensorFlow and tfds cannot be imported."""
  folder = tmp_path_factory.mktemp("no_tensorflow")
  (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE)
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(
      [str(folder), ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
  for name in BLOCKED:   # hidden: each import fails as for a missing package
    proc = subprocess.run(
        [sys.executable, "-c", f"import importlib.util; assert importlib.util.find_spec("
         f"{name!r}) is None; import {name}"], env=env, cwd=ROOT, capture_output=True,
        text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert f"ModuleNotFoundError: No module named '{name}'" in proc.stderr, proc.stderr
  return env


def _run(env, *args):
  return subprocess.run([sys.executable, *args], env=env, cwd=ROOT, capture_output=True,
                        text=True, timeout=600)


@pytest.fixture(scope="module")
def trained(no_tf_env, tmp_path_factory):
  """A tiny ListOps run of ``train.py`` without TensorFlow: ``(workdir, process)``."""
  base = tmp_path_factory.mktemp("no_tf_run")
  workdir = str(base / "run")
  proc = _run(no_tf_env, "train.py", "--config", "configs/listops/simple.py:tiny",
              "--workdir", workdir, *SMALL)
  return workdir, proc


def test_train_py_runs_without_tensorflow_and_tensorboard_reads_its_scalars(trained):
  workdir, proc = trained
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  assert results["complete"] and results["final_step"] == 4

  from simpletron_jax.run.metric_logging import \
      read_records  # pylint: disable=import-outside-toplevel
  expected = {}
  for record in read_records(os.path.join(workdir, "metrics.jsonl")):
    for name, value in record.items():
      if name not in ("step", "split", "time"):
        expected.setdefault(f"{record['split']}/{name}", []).append((record["step"], value))
  assert {"train/loss", "val/accuracy", "test/accuracy", "info/params"} <= set(expected)

  from tensorboard.backend.event_processing import \
      plugin_event_accumulator as pea  # pylint: disable=import-outside-toplevel
  from tensorboard.util import tensor_util  # pylint: disable=import-outside-toplevel
  board = pea.EventAccumulator(os.path.join(workdir, "tb"), size_guidance={pea.TENSORS: 0})
  board.Reload()
  assert set(board.Tags()["tensors"]) == set(expected) | {"_hparams_/session_start_info"}
  for tag, points in expected.items():
    got = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
           for e in board.Tensors(tag)]
    assert [step for step, _ in got] == [step for step, _ in points], tag
    for (_, value), (_, logged) in zip(got, points):
      if logged is None:   # NaN or infinite: null in the JSONL file
        assert not math.isfinite(value), tag
      else:
        assert value == float(np.float32(logged)), (tag, value, logged)


def test_eval_py_runs_without_tensorflow(trained, no_tf_env):
  workdir, proc = trained
  assert proc.returncode == 0, proc.stderr[-3000:]
  proc = _run(no_tf_env, "eval.py", "--workdir", workdir, "--split", "test")
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(os.path.join(workdir, "eval_best_test.json")) as f:
    evaluated = json.load(f)
  with open(os.path.join(workdir, "results.json")) as f:
    assert evaluated["accuracy"] == json.load(f)["test_accuracy_best_val"]


def _entry_files():
  """The entry points and the package's modules."""
  files = ["train.py", "eval.py"]
  for pattern in ("scripts/*.py", "scripts/experiments/*.py", "benchmarks/*.py",
                  "simpletron_jax/**/*.py"):
    files += sorted(glob.glob(os.path.join(ROOT, pattern), recursive=True))
  return [os.path.join(ROOT, f) for f in files]


def _imported(files):
  """``(module, names)`` of every absolute import in ``files``, at the top or in a function
  (``import a.b``: ``("a.b", ())``; ``from a import b, c``: ``("a", ("b", "c"))``)."""
  found = set()
  for path in files:
    with open(path) as f:
      tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        found.update((alias.name, ()) for alias in node.names)
      elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        found.add((node.module, tuple(sorted(a.name for a in node.names if a.name != "*"))))
  return sorted(found)


_IMPORT_ALL = '''
import importlib, importlib.util, json, sys
imports, failures, skipped = json.loads(sys.argv[1]), {}, []
for module, names in imports:
  root = module.split(".")[0]
  if root in BLOCKED or root == "__future__":
    continue
  try:
    if importlib.util.find_spec(root) is None or importlib.util.find_spec(module) is None:
      skipped.append(module)   # not installed here (LRA's own code, an extra)
      continue
    imported = importlib.import_module(module)
    for name in names:
      if not hasattr(imported, name):
        importlib.import_module(f"{module}.{name}")
  except ModuleNotFoundError as e:   # an optional package it imports is not installed
    if any((e.name or "") == o or (e.name or "").startswith(o + ".") for o in OPTIONAL):
      skipped.append(module)
    else:
      failures[module] = f"{type(e).__name__}: {e}"
  except Exception as e:  # noqa: BLE001
    failures[module] = f"{type(e).__name__}: {e}"
print(json.dumps({"failures": failures, "skipped": skipped}))
'''


def test_every_module_the_entry_points_import_imports_without_tensorflow(no_tf_env):
  imports = _imported(_entry_files())
  assert ("simpletron_jax.run.tensorboard_writer", ("TensorBoardWriter",)) in imports
  env = dict(no_tf_env)
  # The scripts import their neighbours (exp_common, seeds, torch_step, ...) by name.
  env["PYTHONPATH"] = os.pathsep.join(
      [env["PYTHONPATH"]] + [os.path.join(ROOT, d)
                             for d in ("scripts", "scripts/experiments", "benchmarks")])
  code = f"BLOCKED = {BLOCKED!r}\nOPTIONAL = {OPTIONAL!r}\n{_IMPORT_ALL}"
  proc = subprocess.run([sys.executable, "-c", code, json.dumps(imports)], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = json.loads(proc.stdout.strip().splitlines()[-1])
  assert report["failures"] == {}, report["failures"]
  unexpected = [m for m in report["skipped"] if not any(
      m == o or m.startswith(o + ".") for o in OPTIONAL) and m not in _NEEDS_OPTIONAL]
  assert unexpected == [], unexpected


def test_reading_a_tfds_copy_without_the_tfds_extra_names_the_extra(monkeypatch):
  """tensorflow-datasets missing, then TensorFlow missing for a tfrecord copy: one line each,
  naming the folder, ``data.tfds_data_dir`` and ``pip install -e ".[tfds]"``."""
  folder = "/data/tfds/cifar10/3.0.2"
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)   # import fails
  with pytest.raises(errors.RunError) as error:
    tfds_io.read_tfds_split(folder, "train", ("image", "label"))
  message = str(error.value)
  assert message.startswith(f"reading the tfds copy in {folder} (data.tfds_data_dir) needs "
                            "tensorflow-datasets"), message
  assert 'pip install -e ".[tfds]"' in message and "\n" not in message
  info = types.SimpleNamespace(file_format="tfrecord")
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", types.SimpleNamespace(
      builder_from_directory=lambda path: types.SimpleNamespace(info=info)))
  monkeypatch.setitem(sys.modules, "tensorflow", None)
  with pytest.raises(errors.RunError) as error:
    tfds_io.read_tfds_split(folder, "train", ("image", "label"))
  message = str(error.value)
  assert message.startswith(f"the tfds copy in {folder} (data.tfds_data_dir) is stored as "
                            "tfrecord, which needs TensorFlow to read: "
                            'pip install -e ".[tfds]"'), message
  assert "\n" not in message
