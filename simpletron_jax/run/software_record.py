"""What a run was computed with besides its config: versions, devices, hosts, git commit.

:func:`software` is the flat record in ``config.json`` (under ``run_record.SOFTWARE_KEY``) and
``results.json``, never part of a fingerprint or a resume check. JAX is not imported here.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
import sys
from typing import Any, Mapping

from simpletron_jax.runtime import cli


# The distributions whose versions :func:`software` records, with the key each gets.
SOFTWARE_PACKAGES = (("jax", "jax_version"), ("jaxlib", "jaxlib_version"),
                     ("flax", "flax_version"), ("optax", "optax_version"),
                     ("orbax-checkpoint", "orbax_checkpoint_version"),
                     ("numpy", "numpy_version"), ("clu", "clu_version"),
                     ("grain", "grain_version"), ("tensorboard", "tensorboard_version"),
                     ("ml-collections", "ml_collections_version"))
# The CUDA stack of :func:`gpu_software`, with its names in :func:`software_line`.
GPU_KEYS = (("cuda_version", "CUDA"), ("cudnn_version", "cuDNN"),
            ("cuda_driver_version", "CUDA driver API"),
            ("nvidia_driver_version", "NVIDIA driver"))


@functools.lru_cache(maxsize=1)
def _versions_and_commit() -> dict[str, Any]:
  """The package versions and git commit of :func:`software` (looked up once per process)."""
  out: dict[str, Any] = {"python_version": platform.python_version()}
  for dist, key in SOFTWARE_PACKAGES:
    try:
      out[key] = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
      out[key] = None
  commit = dirty = None
  if os.path.exists(os.path.join(cli.REPO_ROOT, ".git")):   # not for an installed copy
    try:
      head = subprocess.run(["git", "-C", cli.REPO_ROOT, "rev-parse", "HEAD"], capture_output=True,
                            text=True, timeout=10, check=False)
      if head.returncode == 0:
        commit = head.stdout.strip()
        status = subprocess.run(["git", "-C", cli.REPO_ROOT, "status", "--porcelain",
                                 "--untracked-files=no"], capture_output=True, text=True,
                                timeout=30, check=False)
        dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):   # no git, or it hangs
      pass
  out.update(git_commit=commit, git_dirty=dirty)
  return out


def _cuda_version(number: int) -> str:
  """CUDA's version integer (``12040``: major * 1000 + minor * 10) as ``"12.4"``."""
  return f"{number // 1000}.{number % 1000 // 10}"


def _cudnn_version(number: int) -> str:
  """cuDNN's version integer as ``"9.1.0"`` (major * 10000 + minor * 100 + patch from cuDNN 9
  on, major * 1000 + minor * 100 + patch before)."""
  if number >= 90000:
    return f"{number // 10000}.{number % 10000 // 100}.{number % 100}"
  return f"{number // 1000}.{number % 1000 // 100}.{number % 100}"


def gpu_software(backend: str | None) -> dict[str, Any]:
  """The CUDA stack of a run on a CUDA GPU: ``cuda_version`` (the CUDA runtime jax's plugin
  loaded), ``cudnn_version``, ``cuda_driver_version`` (the CUDA API version the driver
  supports) and ``nvidia_driver_version`` (``nvidia-smi``'s, e.g. ``"550.54.15"``).

  ``backend``: ``jax.default_backend()``. Each key is None off a GPU or where it cannot be
  read (no ``nvidia-smi``, a ROCm GPU, a plugin without the query). Never raises.
  """
  out: dict[str, Any] = {key: None for key, _ in GPU_KEYS}
  if backend != "gpu":
    return out
  try:   # the version queries of jax's CUDA plugin (jax_cuda12_plugin._versions)
    from jax._src.lib import cuda_versions  # pylint: disable=import-outside-toplevel
  except ImportError:
    cuda_versions = None
  for key, query, form in (("cuda_version", "cuda_runtime_get_version", _cuda_version),
                           ("cudnn_version", "cudnn_get_version", _cudnn_version),
                           ("cuda_driver_version", "cuda_driver_get_version", _cuda_version)):
    try:
      out[key] = form(int(getattr(cuda_versions, query)()))
    except Exception:  # pylint: disable=broad-except  (no plugin, no such query, no driver)
      pass
  try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=20, check=False)
    if smi.returncode == 0 and smi.stdout.strip():
      out["nvidia_driver_version"] = smi.stdout.strip().splitlines()[0].strip()
  except (OSError, subprocess.SubprocessError):
    pass
  return out


def software(device_kind: str | None, device_count: int | None,
             process_count: int | None) -> dict[str, Any]:
  """What a run was computed with besides its config: versions, devices, hosts, commit.

  Args:
    device_kind: ``jax.devices()[0].device_kind`` (``"cpu"``, ``"NVIDIA H100 80GB HBM3"``,
      ``"TPU v4"``).
    device_count: ``jax.device_count()`` (all hosts).
    process_count: ``jax.process_count()``.

  Returns:
    A flat JSON-ready dict: ``python_version``, the versions of :data:`SOFTWARE_PACKAGES`
    (None when not installed), ``device_kind``, ``device_count``, ``process_count``, the CUDA
    stack (:func:`gpu_software`), ``git_commit`` (the project's ``HEAD``; None outside a git
    checkout) and ``git_dirty`` (tracked files changed since that commit).
  """
  backend = None
  if "jax" in sys.modules:   # the run's own backend; JAX is not started here for it
    try:
      backend = sys.modules["jax"].default_backend()
    except Exception:  # pylint: disable=broad-except  (no backend could start)
      backend = None
  return {**_versions_and_commit(), **_gpu_software_once(backend), "device_kind": device_kind,
          "device_count": device_count, "process_count": process_count}


@functools.lru_cache(maxsize=None)
def _gpu_software_once(backend: str | None) -> dict[str, Any]:
  """:func:`gpu_software`, looked up once per process and backend."""
  return gpu_software(backend)


def software_line(record: Mapping[str, Any]) -> str:
  """One line for a :func:`software` record, e.g. ``python 3.11.7, jax 0.10.2, ... numpy 2.2.6;
  cpu x2, 1 process; git 1a2b3c4d (dirty)``; ``"not recorded"`` when it holds none."""
  versions = [f"python {record['python_version']}"] if record.get("python_version") else []
  versions += [f"{dist} {record[key]}" for dist, key in SOFTWARE_PACKAGES if record.get(key)]
  if not versions:
    return "not recorded"
  line = ", ".join(versions)
  if record.get("device_kind"):
    processes = record.get("process_count")
    line += (f"; {record['device_kind']} x{record.get('device_count')}, "
             f"{processes} process{'' if processes == 1 else 'es'}")
  gpu = [f"{name} {record[key]}" for key, name in GPU_KEYS if record.get(key)]
  if gpu:
    line += "; " + ", ".join(gpu)
  if record.get("git_commit"):
    line += f"; git {str(record['git_commit'])[:10]}{' (dirty)' if record.get('git_dirty') else ''}"
  return line
