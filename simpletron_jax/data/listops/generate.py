"""Generating ListOps with LRA's algorithm, seeded, and writing it in LRA's TSV layout.

LRA's generator (``lra_benchmarks/data/listops.py``) used the unseeded global
``random`` module. Here the data are a pure function of an integer seed and the
generator arguments, whatever the number of worker processes: each seeded block
draws candidates with :func:`simpletron_jax.data.listops.trees.sample_token_ids`
(LRA's tree algorithm, :mod:`.trees`), and :func:`generate_splits` keeps the
distinct examples of the blocks in block order. :func:`generate_dataset` writes
``{task}_{split}.tsv`` files (:func:`write_tsv`) and :func:`ensure_generated`
reuses a finished folder; :mod:`simpletron_jax.data.listops.read` reads them.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import os
import random
import sys
import time
from typing import Any, Iterable, Iterator, TextIO

import filelock
import numpy as np

from simpletron_jax.data import workers as worker_pool
from simpletron_jax.data.listops.tokens import NUM_CLASSES, _evaluate_ids
from simpletron_jax.data.listops.trees import _max_tree_length, sample_token_ids, to_source
from simpletron_jax.runtime import atomic_io, progress


_BLOCK_SIZE = 256
"""Accepted candidates per block. Block ``b`` has its own random stream seeded
from ``(seed, b)``. This is part of the data definition; changing it changes
the data."""


def _check_args(seed: int, num_train: int, num_val: int, num_test: int, min_length: int,
                max_length: int, max_depth: int, max_args: int) -> None:
  for name, value in (("seed", seed), ("num_train", num_train), ("num_val", num_val),
                      ("num_test", num_test), ("min_length", min_length),
                      ("max_length", max_length), ("max_depth", max_depth),
                      ("max_args", max_args)):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
      raise TypeError(f"{name} must be an int, got {value!r}")
  if min(num_train, num_val, num_test) < 0:
    raise ValueError("example counts must be >= 0")
  if max_depth < 1 or max_args < 2:
    raise ValueError(f"need max_depth >= 1 and max_args >= 2, got {max_depth}, {max_args}")
  # Lengths that can occur: 1 (a digit) and 4 .. the full tree.
  lo, hi = min_length + 1, min(max_length - 1, _max_tree_length(max_depth, max_args))
  if lo > hi or (hi < 4 and not lo <= 1 <= hi):
    raise ValueError(
        f"no ListOps tree with max_depth={max_depth}, max_args={max_args} has a length "
        f"strictly between min_length={min_length} and max_length={max_length} tokens")


def _generate_block(task: tuple[int, int, int, int, int, int]) -> list[tuple[bytes, str, int]]:
  """Worker: the accepted candidates of one block, in order.

  Args:
    task: ``(seed, block, min_length, max_length, max_depth, max_args)``.

  Returns:
    ``_BLOCK_SIZE`` tuples ``(dedup key, Source string, label)``. The key is
    a 16-byte BLAKE2b digest of the paren-free token ids.
  """
  seed, block, min_length, max_length, max_depth, max_args = task
  rng = random.Random(f"simpletron_jax.listops/{seed}/{block}")
  out = []
  while len(out) < _BLOCK_SIZE:
    ids = sample_token_ids(rng, max_depth, max_args)
    if min_length < len(ids) < max_length:
      key = hashlib.blake2b(bytes(ids), digest_size=16).digest()
      out.append((key, to_source(ids), _evaluate_ids(ids)))
  return out


def _default_workers() -> int:
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # Not Linux.
    return os.cpu_count() or 1


def _iter_examples(seed: int, total: int, *, min_length: int, max_length: int, max_depth: int,
                   max_args: int, num_workers: int | None) -> Iterator[tuple[str, int]]:
  """Yields the first ``total`` distinct accepted examples, in block order.

  Blocks are generated in rounds, in parallel when ``num_workers > 1``. They
  are always consumed in block order, and a duplicate keeps its first
  occurrence, so the output does not depend on ``num_workers``.
  """
  if total <= 0:
    return
  workers = _default_workers() if num_workers is None else int(num_workers)
  if workers < 1:
    raise ValueError(f"num_workers must be >= 1, got {num_workers}")
  seen: set[bytes] = set()
  produced = 0
  next_block = 0
  # tqdm on a terminal, a line every 30 s in a log; TQDM_DISABLE=1 turns it off.
  bar = progress.bar(total=total, desc="ListOps examples", unit="ex", smoothing=0.05)
  # Spawned workers, not forked: the trainer may already run JAX threads (worker_pool).
  with bar, worker_pool.executor(workers, math.ceil(total / _BLOCK_SIZE)) as pool:
    while produced < total:
      n_blocks = math.ceil((total - produced) / _BLOCK_SIZE)
      tasks = [(seed, b, min_length, max_length, max_depth, max_args)
               for b in range(next_block, next_block + n_blocks)]
      next_block += n_blocks
      before = produced
      for block in worker_pool.results(pool, _generate_block, tasks, ordered=True,
                                       what="ListOps"):
        for key, source, label in block:
          if key in seen:
            continue
          seen.add(key)
          produced += 1
          bar.update(1)
          yield source, label
          if produced == total:
            break
        if produced == total:
          break
      if produced == before:
        raise RuntimeError(
            f"found only {produced} distinct ListOps examples with lengths in "
            f"({min_length}, {max_length}) tokens, max_depth={max_depth}, max_args={max_args}, "
            f"but {total} were requested; widen the length bounds or ask for fewer")


def generate_splits(seed: int, *, num_train: int = 96000, num_val: int = 2000,
                    num_test: int = 2000, min_length: int = 500, max_length: int = 2000,
                    max_depth: int = 10, max_args: int = 10,
                    num_workers: int | None = None) -> dict[str, list[tuple[str, int]]]:
  """Generates the train/val/test splits with LRA's algorithm, seeded.

  Candidates are drawn as in LRA's ``generate_tree`` (see
  :func:`simpletron_jax.data.listops.trees.generate_tree`). A candidate is kept when
  ``min_length < length < max_length``. The length counts tokens (digits,
  operators and ``]``) and the inequalities are strict. Duplicates are
  dropped. The first ``num_train`` distinct examples are train, the next
  ``num_val`` are val and the next ``num_test`` are test. LRA split its
  examples in ``set()`` order. That order is arbitrary, so the two split
  rules give the same distribution.

  Candidates come in blocks of a fixed size. Block ``b`` draws from
  ``random.Random`` seeded with ``(seed, b)``. Blocks are merged in block
  order, and a duplicate keeps its first occurrence. So the result is a pure
  function of the arguments other than ``num_workers``. The number of
  processes only changes the speed. A progress bar (:func:`simpletron_jax.runtime.progress.bar`)
  counts accepted examples.

  With the defaults, LRA's lengths are 500 < tokens < 2000.

  Args:
    seed: an int; ``(seed, block)`` seeds each block's stream.
    num_train, num_val, num_test: examples per split.
    min_length, max_length: exclusive length bounds in tokens.
    max_depth: nodes at this depth are leaves. The root has depth 1.
    max_args: the most children an operator can have.
    num_workers: processes to use. ``None`` means every CPU this process may
      run on. 1 means this process only.

  Returns:
    ``{"train": [...], "val": [...], "test": [...]}``. Each list holds
    ``(source, label)`` pairs: the parenthesised ``Source`` string and an int
    label in 0..9.

  Raises:
    TypeError: if an argument is not an int.
    ValueError: on a negative count, ``max_depth < 1``, ``max_args < 2``,
      or length bounds that no tree can meet.
    RuntimeError: if the bounds admit too few distinct trees.
  """
  _check_args(seed, num_train, num_val, num_test, min_length, max_length, max_depth, max_args)
  stream = _iter_examples(int(seed), num_train + num_val + num_test, min_length=min_length,
                          max_length=max_length, max_depth=max_depth, max_args=max_args,
                          num_workers=num_workers)
  try:
    return {split: list(itertools.islice(stream, n))
            for split, n in (("train", num_train), ("val", num_val), ("test", num_test))}
  finally:
    stream.close()


# ----------------------------------------------------------------------------
# Files.


def write_tsv(examples: Iterable[tuple[str, int]], path: str) -> int:
  """Writes examples as an LRA ListOps TSV file, atomically.

  The file has the header line ``Source\\tTarget``, then one
  ``source<TAB>label`` line per example. Lines end with ``\\n``. LRA's
  ``csv.writer`` wrote ``\\r\\n``, and :func:`load_split` reads both. The
  text goes to a temporary file in the same folder, which then replaces
  ``path``. A reader never sees a half-written file.

  Args:
    examples: ``(source, label)`` pairs. ``source`` is the ``Source`` string,
      ``label`` an int in 0..9. Any iterable is consumed once.
    path: the file to write.

  Returns:
    The number of examples written.

  Raises:
    ValueError: if a source holds a tab or a newline, or a label is not in
      0..9. ``path`` is then left as it was.
  """
  count = 0
  with _open_atomic(path) as f:
    f.write("Source\tTarget\n")
    for source, label in examples:
      if "\t" in source or "\n" in source or "\r" in source:
        raise ValueError(f"example {count}: source contains a tab or newline")
      label = int(label)
      if not 0 <= label < NUM_CLASSES:
        raise ValueError(f"example {count}: label {label} is not in 0..{NUM_CLASSES - 1}")
      f.write(f"{source}\t{label}\n")
      count += 1
  return count


def _write_json(obj: Any, path: str) -> None:
  with _open_atomic(path) as f:
    json.dump(obj, f, indent=2, sort_keys=True)
    f.write("\n")


@contextlib.contextmanager
def _open_atomic(path: str) -> Iterator[TextIO]:
  """A text file (UTF-8, ``\\n`` line ends) that replaces ``path`` when the ``with`` block ends
  cleanly and is removed on an exception, leaving ``path`` as it was
  (:func:`simpletron_jax.runtime.atomic_io.atomic_path`)."""
  with atomic_io.atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
    yield f


_META_FORMAT = "simpletron_jax.data.listops/1"


def _generator_args(seed: int, **kwargs: Any) -> dict[str, int]:
  """Every generator argument that affects the data, defaults filled in.

  Raises:
    TypeError: on an unknown argument name.
  """
  args = {"seed": seed, "num_train": 96000, "num_val": 2000, "num_test": 2000,
          "min_length": 500, "max_length": 2000, "max_depth": 10, "max_args": 10}
  unknown = set(kwargs) - set(args)
  if unknown:
    raise TypeError(f"unknown ListOps generator argument(s): {', '.join(sorted(unknown))}")
  args.update(kwargs)
  _check_args(**args)
  return {k: int(v) for k, v in args.items()}


def generate_dataset(out_dir: str, *, seed: int, task: str = "basic",
                     num_workers: int | None = None, **kwargs: Any) -> dict[str, str]:
  """Generates ListOps and writes it in LRA's file layout.

  Writes ``{task}_train.tsv``, ``{task}_val.tsv`` and ``{task}_test.tsv``
  (see :func:`write_tsv`), then ``{task}_meta.json``, which holds the
  generator arguments. The meta file is written last, so if it is present
  the TSVs are complete. The content equals :func:`generate_splits` with the
  same arguments. The examples are streamed to disk and never all held in
  memory.

  Args:
    out_dir: the folder, created if missing.
    seed: see :func:`generate_splits`.
    task: the file name prefix. LRA's is ``basic``.
    num_workers: see :func:`generate_splits`. It does not change the data.
    **kwargs: the other :func:`generate_splits` arguments (``num_train``,
      ``num_val``, ``num_test``, ``min_length``, ``max_length``,
      ``max_depth``, ``max_args``).

  Returns:
    ``{"train": path, "val": path, "test": path}``.

  Raises:
    TypeError, ValueError, RuntimeError: as :func:`generate_splits`.
  """
  args = _generator_args(seed, **kwargs)
  os.makedirs(out_dir, exist_ok=True)
  start = time.time()
  sizes = (("train", args["num_train"]), ("val", args["num_val"]), ("test", args["num_test"]))
  stream = _iter_examples(args["seed"], sum(n for _, n in sizes),
                          min_length=args["min_length"], max_length=args["max_length"],
                          max_depth=args["max_depth"], max_args=args["max_args"],
                          num_workers=num_workers)
  paths = {}
  try:
    for split, n in sizes:
      paths[split] = os.path.join(out_dir, f"{task}_{split}.tsv")
      written = write_tsv(itertools.islice(stream, n), paths[split])
      assert written == n, (split, written, n)
  finally:
    stream.close()
  _write_json({"format": _META_FORMAT, "task": task, "arguments": args,
               "seconds": round(time.time() - start, 1)},
              os.path.join(out_dir, f"{task}_meta.json"))
  return paths


def _generated(data_dir: str, task: str, args: dict[str, int]) -> bool:
  """Whether ``data_dir`` holds complete data of these generator ``args``: ``{task}_meta.json``
  (written last) of this format and arguments, and the three TSVs."""
  try:
    with open(os.path.join(data_dir, f"{task}_meta.json"), encoding="utf-8") as f:
      meta = json.load(f)
  except (OSError, ValueError):
    return False
  return (isinstance(meta, dict) and meta.get("format") == _META_FORMAT
          and meta.get("arguments") == args and all(
              os.path.isfile(os.path.join(data_dir, f"{task}_{s}.tsv"))
              for s in ("train", "val", "test")))


def ensure_generated(cache_dir: str, *, seed: int, num_workers: int | None = None,
                     **kwargs: Any) -> str:
  """Returns a folder with the ListOps data for these generator arguments.

  The folder is ``{cache_dir}/seed{seed}_{hash}``, where ``hash`` is a short
  hash of all the generator arguments, defaults included. The data are
  generated there with :func:`generate_dataset` (task ``basic``), but only
  when ``basic_meta.json`` or a TSV is missing, or the meta file's arguments
  differ. Otherwise the files are reused as they are. A process that generates
  holds the file lock ``{folder}.lock`` beside the folder, so two processes that
  need the same set make it once: the second says on stderr that it waits for the
  first, then reads what the first wrote.

  Args:
    cache_dir: parent folder of the generated data sets, created if missing.
    seed: see :func:`generate_splits`.
    num_workers: see :func:`generate_splits`. It is not part of the key.
    **kwargs: the other :func:`generate_splits` arguments.

  Returns:
    The data folder. Pass it to :func:`load_split`.

  Raises:
    TypeError, ValueError, RuntimeError: as :func:`generate_splits`.
  """
  args = _generator_args(seed, **kwargs)
  key = hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:12]
  data_dir = os.path.join(os.path.expanduser(cache_dir), f"seed{args['seed']}_{key}")
  task = "basic"
  if _generated(data_dir, task, args):
    return data_dir
  os.makedirs(os.path.dirname(data_dir), exist_ok=True)
  lock = filelock.FileLock(f"{data_dir}.lock")
  try:
    lock.acquire(timeout=0)
  except filelock.Timeout:
    print(f"ListOps: waiting for another process that is generating {data_dir} (it holds "
          f"{lock.lock_file})", file=sys.stderr, flush=True)
    lock.acquire()
  try:
    if not _generated(data_dir, task, args):   # the other process may have made it
      generate_dataset(data_dir, task=task, num_workers=num_workers, **args)
  finally:
    lock.release()
  return data_dir
