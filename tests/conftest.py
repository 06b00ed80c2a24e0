"""Test setup: two fake CPU devices for pmap (set before jax is imported) and the
repository root on sys.path so ``configs`` imports."""

import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=2").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from simpletron_jax.data.common import RaggedExamples  # noqa: E402
from simpletron_jax import tasks  # noqa: E402


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


@pytest.fixture(scope="session")
def presence_task() -> tasks.TaskData:
  """Train/val/test splits of the presence task (vocab 16, 2 classes)."""
  rng = np.random.default_rng(0)
  return tasks.TaskData(presence_examples(2000, rng), presence_examples(200, rng),
                        presence_examples(200, rng), vocab_size=16, num_classes=2,
                        source="synthetic")
