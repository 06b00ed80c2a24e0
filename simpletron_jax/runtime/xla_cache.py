"""JAX's persistent compilation cache for train.py and the benchmarks.

``train.py`` pads each batch to a 128-token bucket, so a run compiles one train step per bucket
it meets (up to 16 on ListOps; compile times: docs/runs.md). With the cache on, a resumed or
repeated run loads those programs from disk instead of compiling them again.
"""

from __future__ import annotations

import os

DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".cache", "simpletron_jax", "xla")

FLAG_HELP = ("JAX's persistent compilation cache: a resumed or repeated run loads its "
             "compiled steps (one per length bucket) from here instead of compiling them "
             "again. Default: $JAX_COMPILATION_CACHE_DIR, else ~/.cache/simpletron_jax/xla; "
             "'' turns it off.")


def default_dir() -> str:
  """``$JAX_COMPILATION_CACHE_DIR`` if set, else :data:`DEFAULT_DIR`."""
  return os.environ.get("JAX_COMPILATION_CACHE_DIR") or DEFAULT_DIR


def enable(path: str | None, min_compile_secs: float | None = None) -> None:
  """Turns on the persistent compilation cache in ``path``: None means :func:`default_dir`,
  ``""`` leaves it off.

  The folder is not size-capped (JAX's cap, ``jax_compilation_cache_max_size``, needs the
  ``filelock`` package, and without it JAX silently turns the cache off); it may be deleted at
  any time, and the next run compiles again.

  Args:
    path: a folder, created by JAX when it first writes.
    min_compile_secs: keep only programs that took at least this long to compile; None
      keeps JAX's setting (1 s, or ``$JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS``). The
      benchmarks pass 0 to cache every cell.
  """
  if path is None:
    path = default_dir()
  if not path:
    return
  import jax  # pylint: disable=import-outside-toplevel  (the scripts import jax late)
  jax.config.update("jax_compilation_cache_dir", path)
  if min_compile_secs is not None:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_secs))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
