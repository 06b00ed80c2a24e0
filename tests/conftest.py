"""Test setup, done before jax is imported (subprocesses inherit it through the environment):

* two fake CPU devices for pmap;
* XLA's cheapest CPU compilation (``--xla_backend_optimization_level=0``, no expensive LLVM
  passes, no fusion emitters, each program's machine code emitted as one module rather than
  split for parallel threads: with both cores busy running tests the split only added work).
  Compiling takes most of the suite's time and running the tiny test programs little, and
  every comparison in the suite is between programs compiled with the same flags or against
  numpy with a tolerance (the one bit-for-bit comparison of two different programs,
  ``test_models.py``'s GELU, compiles with XLA's default emitters);
* a persistent compilation cache in a temporary folder that lives for one session, so the
  many runs that compile the same tiny train step (restarts, resumed and killed runs, their
  subprocesses) compile it once. Every program is kept, however fast it compiled: the tests
  rebuild the same small programs (a finiteness check, an eval step, one eager operation)
  in new functions and new processes far more often than they meet a new one, so reading
  them back beats compiling them (docs/testing.md has the timings). pytest-xdist workers
  (``-n 2``) inherit the folder and the flags from the controlling process, which loaded this
  file first, so they share one cache. Set ``SIMPLETRON_TEST_NO_CACHE=1`` to compile every
  time;

and the repository root on ``sys.path`` so ``configs`` imports.
"""

import atexit
import gc
import os
import shutil
import signal
import sys
import tempfile
import time

_TEST_XLA_FLAGS = ("--xla_force_host_platform_device_count=2",
                   "--xla_backend_optimization_level=0",
                   "--xla_llvm_disable_expensive_passes=true",
                   "--xla_cpu_use_fusion_emitters=false",
                   "--xla_cpu_parallel_codegen_split_count=1")
_flags = os.environ.get("XLA_FLAGS", "").split()
os.environ["XLA_FLAGS"] = " ".join(_flags + [f for f in _TEST_XLA_FLAGS if f not in _flags])
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The TPU compile-check tests (test_tpu_aot.py, test_tpu_flash.py) load libtpu in each xdist
# worker; without this the second worker fails on libtpu's per-host lock file.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
if not os.environ.get("SIMPLETRON_TEST_NO_CACHE") and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _CACHE = tempfile.mkdtemp(prefix="simpletron_test_xla_cache_")
  atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
if "SIMPLETRON_TEST_DATA_CACHE" not in os.environ:
  _DATA_CACHE = tempfile.mkdtemp(prefix="simpletron_test_data_cache_")
  atexit.register(shutil.rmtree, _DATA_CACHE, ignore_errors=True)
  os.environ["SIMPLETRON_TEST_DATA_CACHE"] = _DATA_CACHE
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from simpletron_jax.data import tasks  # noqa: E402
from simpletron_jax.data.common import RaggedExamples  # noqa: E402


# The small ListOps run of the tests that start train.py: 64/32/32 examples of at most 60
# tokens and one block, every batch at one width (64), so that each step function compiles
# once and the runs share their programs through the session's compilation cache. The data
# are generated once per session into a folder the workers share (an override given after
# these takes precedence, for a test that checks what a run writes to its cache).
SMALL_LISTOPS = (f"--config.data.cache_dir={os.environ['SIMPLETRON_TEST_DATA_CACHE']}",
                 "--config.data.num_train=64", "--config.data.num_val=32",
                 "--config.data.num_test=32", "--config.data.max_tokens=60",
                 "--config.model.max_length=64", "--config.data.bucket=0",
                 "--config.model.num_layers=1")


class InterruptedWhileCollected:
  """An object whose finalizer sends this process SIGINT and waits there for the handler: the
  handler's ``KeyboardInterrupt`` is raised inside ``__del__``, and Python drops it, as it does
  one raised in a garbage-collector callback (JAX's ``_xla_gc_callback``). Create it and let it
  go (``InterruptedWhileCollected()``) with SIGINT's handler Python's own."""

  def __del__(self):
    os.kill(os.getpid(), signal.SIGINT)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:   # the handler runs in here; its error is dropped
      pass


def presence_examples(n: int, rng: np.random.Generator, max_len: int = 40) -> RaggedExamples:
  """A small learnable task: label 1 iff token 3 occurs in a random sequence."""
  seqs, labels = [], []
  for _ in range(n):
    length = int(rng.integers(5, max_len))
    seq = rng.integers(1, 16, length)
    seq[seq == 3] = 4
    label = int(rng.random() < 0.5)
    if label:
      seq[rng.integers(0, length)] = 3
    seqs.append(seq)
    labels.append(label)
  return RaggedExamples.from_sequences(seqs, labels)


def fake_tfds(tmp_path, features, splits, config=None, to=None):
  """Builds a tiny tfds data set, readable without TensorFlow, and returns its version folder.

  ``features``: a dict of ``tfds.features`` by name; ``splits``: split name -> list of rows
  (dicts of ``features``), keyed by their index, or list of ``(key, row)`` pairs; ``config``:
  a builder config name, or None. The builder is named ``fake`` and writes array_record files
  under ``tmp_path / "build"``, so the result is ``build/fake[/config]/1.0.0``; ``to``, a path
  such as ``tfds/cifar10/3.0.2``, moves it there (parents made) and returns that. Skips the test
  without tensorflow_datasets or array_record. tfds makes an empty tmp*tfds folder when it
  constructs a builder without dataset_info.json and never removes it; with
  ``tempfile.tempdir`` at ``tmp_path`` meanwhile, pytest does."""
  tfds = pytest.importorskip("tensorflow_datasets")
  pytest.importorskip("array_record")

  class Fake(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    # tfds looks for checksum files beside the builder's module; a module inside the
    # ``tests`` package sends it down a path that needs importlib_resources.
    __module__ = "__main__"
    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=config)] if config else []

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(features))

    def _split_generators(self, dl_manager):
      return {split: self._generate_examples(rows) for split, rows in splits.items()}

    def _generate_examples(self, rows):
      yield from (row if isinstance(row, tuple) else (i, row) for i, row in enumerate(rows))

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(tempfile, "tempdir", str(tmp_path))
    Fake(data_dir=str(tmp_path / "build"), file_format="array_record").download_and_prepare()
  built = tmp_path / "build" / "fake" / (config or "") / "1.0.0"
  if to is None:
    return built
  to.parent.mkdir(parents=True)
  return built.rename(to)


@pytest.fixture(scope="session")
def presence_task() -> tasks.TaskData:
  """Train/val/test splits of the presence task (vocab 16, 2 classes)."""
  rng = np.random.default_rng(0)
  return tasks.TaskData(presence_examples(2000, rng), presence_examples(200, rng),
                        presence_examples(200, rng), vocab_size=16, num_classes=2,
                        source="synthetic")


def pytest_addoption(parser):
  """``--paper-cells``: also run the full-size paper cells' CPU smoke tests (CI's second step,
  tests/test_paper_cells.py; several minutes of compiling)."""
  parser.addoption("--paper-cells", action="store_true", default=False,
                   help="run the tests marked paper_cells (full-size paper cells on CPU)")


def pytest_configure(config):
  """Registers the ``paper_cells`` mark."""
  config.addinivalue_line("markers", "paper_cells: a full-size paper cell on CPU; runs only "
                          "with --paper-cells")


def _heavy(item) -> bool:
  """Whether ``item`` is one of the long tests: marked ``slow`` or ``multihost``."""
  return any(item.get_closest_marker(mark) for mark in ("slow", "multihost"))


def _heavy_modules_first(items) -> None:
  """Reorders ``items`` in place: the modules holding the most long tests first (most
  first), then the others, each module's tests kept together and in order.

  pytest-xdist's worksteal hands each worker half of the list and lets an idle worker take
  the tail of the other's queue: with the long tests at the front, the last tests to run are
  short ones, and neither worker waits on a long test at the end.
  """
  modules: dict[str, list] = {}
  for item in items:
    modules.setdefault(item.nodeid.split("::")[0], []).append(item)
  weight = {name: sum(map(_heavy, group)) for name, group in modules.items()}
  order = sorted(modules, key=lambda name: -weight[name])   # stable: ties keep file order
  items[:] = [item for name in order for item in modules[name]]


def pytest_collection_modifyitems(config, items):
  """Runs the modules with the most long tests first (:func:`_heavy_modules_first`); skips
  the ``paper_cells`` tests unless ``--paper-cells`` is given."""
  _heavy_modules_first(items)
  if config.getoption("--paper-cells"):
    return
  skip = pytest.mark.skip(reason="full-size paper cell: run with --paper-cells")
  for item in items:
    if "paper_cells" in item.keywords:
      item.add_marker(skip)


def pytest_collection_finish(session):
  """Fewer, shorter garbage collections in the process that runs the tests: what collection
  imported stays out of them (``gc.freeze``), and they start after 20,000 new objects instead
  of 700. Tracing and lowering make many short-lived objects, and each full collection walked
  the whole heap (JAX's caches included): on ``test_explain.py``, ``test_train.py`` and
  ``test_lra_golden.py`` with ``-n 2`` the workers spent 3.1 to 4.6 s in it, against 1.1 to
  1.9 s (``benchmarks/results/cpu/test_suite_speed.md``)."""
  del session
  gc.collect()
  gc.freeze()
  gc.set_threshold(20000, 20, 20)
