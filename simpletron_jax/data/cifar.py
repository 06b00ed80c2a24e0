"""CIFAR-10's python release (``cifar-10-python.tar.gz``, Krizhevsky, 2009), read safely.

:func:`read_release` reads the five training batches and the test batch from the tarball or
its ``cifar-10-batches-py`` folder; :func:`simpletron_jax.data.image.cifar_npz` makes them the
grayscale npz the image task reads (``python -m simpletron_jax.data prepare --task image``).
A batch is a Python 2 pickle; :class:`_BatchUnpickler` refuses any global but numpy's array
reconstruction, so a tampered file cannot run code.
"""

from __future__ import annotations

import importlib
import io
import os
import pickle

import numpy as np

from simpletron_jax.data import sources

CIFAR_DIR = "cifar-10-batches-py"
CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST = "test_batch"
DOWNLOAD = sources.Download("cifar-10-python.tar.gz",
                            "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
                            # MD5 as torchvision and others check it.
                            "c58f30108f718f92721af3b95e74349a", "CIFAR-10, python version")


class _BatchUnpickler(pickle.Unpickler):
  """Reads CIFAR-10's python batches (Python 2 pickles of dicts, lists, bytes and one uint8
  array) and nothing else: any other global a pickle names is refused, so a tampered file
  cannot run code."""

  # numpy's array reconstruction; ``_codecs.encode`` is how a Python 3 protocol-2 pickle
  # writes bytes (Python 2's, the release's, needs no global for them).
  _ALLOWED = {("numpy", "ndarray"), ("numpy", "dtype"),
              ("numpy.core.multiarray", "_reconstruct"),
              ("numpy._core.multiarray", "_reconstruct"),
              ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
              ("_codecs", "encode")}

  def find_class(self, module, name):
    """The allowed names; raises ``pickle.UnpicklingError`` for any other."""
    if (module, name) not in self._ALLOWED:
      raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR batch")
    if module == "numpy":
      return getattr(np, name)
    if module == "_codecs":
      return importlib.import_module("_codecs").encode
    try:
      multiarray = importlib.import_module("numpy._core.multiarray")
    except ImportError:   # numpy 1.x
      multiarray = importlib.import_module("numpy.core.multiarray")
    return getattr(multiarray, name)


def read_cifar_batch(data: bytes, where: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
  """One python batch of CIFAR-10.

  Args:
    data: the pickled batch (a dict with ``data`` ``[N, 3072]`` uint8, the red, green and
      blue 32x32 planes in turn, ``labels`` and ``filenames``).
    where: the file, for the messages.

  Returns:
    ``(rgb [N, 32, 32, 3] uint8, labels [N] int64, file names)``.

  Raises:
    DataError: naming ``where`` when it is not such a batch.
  """
  try:
    batch = _BatchUnpickler(io.BytesIO(data), encoding="bytes").load()
    batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
    pixels = np.asarray(batch["data"], dtype=np.uint8)
    labels = np.asarray(batch["labels"], dtype=np.int64)
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in batch["filenames"]]
  except (pickle.UnpicklingError, AttributeError, KeyError, TypeError, ValueError, EOFError) as e:
    raise sources.DataError(f"{where}: not a CIFAR-10 python batch ({type(e).__name__}: {e}); "
                            f"fetch {DOWNLOAD.file} again from {DOWNLOAD.url}") from None
  if pixels.ndim != 2 or pixels.shape[1] != 3072 or len(labels) != len(pixels) or (
      len(names) != len(pixels)):
    raise sources.DataError(f"{where}: expected data [N, 3072] with N labels and file names, "
                            f"found data {pixels.shape}, {len(labels)} labels, {len(names)} "
                            "names")
  rgb = pixels.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
  return rgb, labels, names


def _batches(source: str) -> dict[str, bytes]:
  """The batch files' bytes from the tarball or a folder (``cifar-10-batches-py`` or one
  above it).

  Raises:
    DataError: a batch is missing (naming the source).
  """
  wanted = (*CIFAR_TRAIN, CIFAR_TEST)
  found: dict[str, bytes] = {}
  if os.path.isdir(source):
    for folder in (source, os.path.join(source, CIFAR_DIR)):
      if all(os.path.isfile(os.path.join(folder, n)) for n in wanted):
        for n in wanted:
          with open(os.path.join(folder, n), "rb") as f:
            found[n] = f.read()
        break
  else:
    for parts, open_member in sources.iter_tar(source):
      if len(parts) >= 2 and parts[-2] == CIFAR_DIR and parts[-1] in wanted:
        with open_member() as f:
          found[parts[-1]] = f.read()
  missing = [n for n in wanted if n not in found]
  if missing:
    raise sources.DataError(f"{source}: no {CIFAR_DIR}/{', '.join(missing)}; expected "
                            f"{DOWNLOAD.file} ({DOWNLOAD.url}) or its {CIFAR_DIR} folder")
  return found


def read_release(source: str) -> dict[str, tuple[np.ndarray, np.ndarray, list[str]]]:
  """Both splits of CIFAR-10's python release, in the release's order.

  Args:
    source: ``cifar-10-python.tar.gz`` or its ``cifar-10-batches-py`` folder.

  Returns:
    ``{"train" | "test": (rgb [N, 32, 32, 3] uint8, labels [N] int64, file names)}``, train
    over ``data_batch_1..5`` in turn.

  Raises:
    DataError: a missing or damaged batch (naming it).
  """
  raw = _batches(source)
  out = {}
  for split, names in (("train", CIFAR_TRAIN), ("test", (CIFAR_TEST,))):
    parts = [read_cifar_batch(raw[n], f"{source}:{CIFAR_DIR}/{n}") for n in names]
    out[split] = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                  [name for p in parts for name in p[2]])
  return out
