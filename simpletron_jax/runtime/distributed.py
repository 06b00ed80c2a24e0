"""Multi-host runs (one process per host, the same command; docs/scaling.md "TPU VM pods and
multi-GPU hosts"): ``jax.distributed`` start-up with a coordinator time-out, after which the
steps reduce over every host's devices, and a check that all hosts hold the same config and
data."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import socket
import sys
import threading
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

# Config fields that name a place on the host's own disk; they may differ between hosts
# (the data they lead to is compared instead, see data_fingerprint).
HOST_LOCAL_FIELDS = ("data.data_dir", "data.cache_dir", "data.tfds_data_dir")


class CoordinatorTimeoutError(TimeoutError):
  """The coordinator (process 0) could not be reached within the time-out."""


def _split_address(address: str) -> tuple[str, int]:
  """``"host:port"`` -> ``(host, port)``; raises ValueError naming the flag otherwise."""
  host, sep, port = address.rpartition(":")
  if not sep or not host or not port.isdigit():
    raise ValueError(f"--coordinator_address={address!r} must be host:port, "
                     "e.g. 10.0.0.2:8476")
  return host.strip("[]"), int(port)


def wait_for_coordinator(address: str, timeout_s: float) -> None:
  """Polls the coordinator's ``address`` (``host:port``) over TCP until it accepts.

  Raises:
    CoordinatorTimeoutError: nothing accepted within ``timeout_s`` seconds (named).
    ValueError: ``address`` is not ``host:port``.
  """
  host, port = _split_address(address)
  deadline = time.monotonic() + timeout_s
  while True:
    try:
      with socket.create_connection((host, port), timeout=min(5.0, max(timeout_s, 0.1))):
        return
    except OSError as err:
      if time.monotonic() >= deadline:
        raise CoordinatorTimeoutError(
            f"could not reach the jax.distributed coordinator at {address} within "
            f"{timeout_s:g} s (last error: {err}). Is process 0 running, started with "
            "the same --coordinator_address, and is the port open between the hosts? "
            "(train.py flags --coordinator_address, --distributed_timeout)") from err
      time.sleep(0.25)


def _watchdog(timeout_s: float, what: str) -> threading.Timer:
  """A started timer that prints why shortly before XLA aborts a stuck start-up with
  ``DEADLINE_EXCEEDED`` (no Python exception)."""
  def report():
    print(f"ERROR: jax.distributed.initialize did not complete within {timeout_s:g} s "
          f"({what}). Every process must be started with the same --num_processes and "
          "--coordinator_address and a distinct --process_id; XLA will now abort with "
          "DEADLINE_EXCEEDED.", file=sys.stderr, flush=True)

  timer = threading.Timer(max(timeout_s - 1.0, 0.0), report)
  timer.daemon = True
  timer.start()
  return timer


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, timeout_s: float = 300.0) -> None:
  """Joins this process to a multi-host run; call before any other JAX use.

  With every argument None, ``jax.distributed.initialize`` finds the cluster itself (Cloud
  TPU VMs, SLURM, Open MPI); ``coordinator_address`` (process 0's ``host:port``) defaults to
  ``$JAX_COORDINATOR_ADDRESS``. CPU collectives use gloo (tests/test_multihost.py).
  ``timeout_s``: seconds to wait for the coordinator and for all processes to register.

  Raises:
    CoordinatorTimeoutError: a process other than 0 could not reach the coordinator (if the
      others never arrive, XLA aborts process 0 after a printed message).
    ValueError: a malformed address or ``process_id`` outside ``[0, num_processes)``.
  """
  if num_processes is not None and process_id is not None \
      and not 0 <= process_id < num_processes:
    raise ValueError(f"--process_id={process_id} must lie in [0, --num_processes="
                     f"{num_processes})")
  if jax.config.jax_cpu_collectives_implementation in (None, "", "none"):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  start = time.monotonic()
  coordinator_address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
  if coordinator_address and process_id:
    wait_for_coordinator(coordinator_address, timeout_s)
  remaining = max(timeout_s - (time.monotonic() - start), 1.0)
  timer = _watchdog(remaining, f"coordinator {coordinator_address or '(auto-detected)'}, "
                    f"process {process_id} of {num_processes}")
  try:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id,
                               initialization_timeout=math.ceil(remaining))
  finally:
    timer.cancel()


def barrier(name: str) -> None:
  """Waits until every host reaches the barrier ``name``; a no-op on one host."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def agree_on_flag(flag: bool) -> bool:
  """Process 0's ``flag`` on every host (a collective call on several hosts).

  For decisions that each host would otherwise take from its own clock, such as
  ``max_train_minutes``: if one host left the training loop while another ran one more
  ``pmap``ped step, that step would wait for it forever.
  """
  if jax.process_count() == 1:
    return bool(flag)
  return bool(multihost_utils.broadcast_one_to_all(np.asarray(flag, np.bool_)))


# ----------------------------------------------------------------------------
# Start-up consistency check.


def _update_with(digest, value: Any) -> None:
  """Feeds ``value`` (arrays, dataclasses of arrays, scalars) into ``digest``."""
  if isinstance(value, np.ndarray):
    digest.update(f"{value.dtype.str}{value.shape}".encode())
    digest.update(np.ascontiguousarray(value).tobytes())
  elif dataclasses.is_dataclass(value):
    for field in dataclasses.fields(value):
      digest.update(field.name.encode())
      _update_with(digest, getattr(value, field.name))
  else:
    digest.update(repr(value).encode())


def data_fingerprint(data) -> str:
  """SHA-256 hex digest of every array, size and label of a ``tasks.TaskData`` (any dataclass
  of numpy arrays), without its ``source`` path: equal when hosts loaded the same examples in
  the same order."""
  digest = hashlib.sha256()
  for field in dataclasses.fields(data):
    if field.name != "source":
      digest.update(field.name.encode())
      _update_with(digest, getattr(data, field.name))
  return digest.hexdigest()


def config_fingerprint(config: ml_collections.ConfigDict) -> str:
  """SHA-256 hex digest of ``config`` as sorted JSON, without :data:`HOST_LOCAL_FIELDS`."""
  tree = json.loads(config.to_json_best_effort())
  for field in HOST_LOCAL_FIELDS:
    *parents, leaf = field.split(".")
    node = tree
    for part in parents:
      node = node.get(part, {}) if isinstance(node, dict) else {}
    if isinstance(node, dict):
      node.pop(leaf, None)
  return hashlib.sha256(json.dumps(tree, sort_keys=True).encode()).hexdigest()


def _hosts_differing(digest_hex: str) -> list[int]:
  """Processes whose ``digest_hex`` differs from process 0's (a collective call)."""
  words = np.frombuffer(bytes.fromhex(digest_hex), np.uint32)
  gathered = np.asarray(multihost_utils.process_allgather(words))  # [processes, 8]
  return [p for p in range(gathered.shape[0]) if not np.array_equal(gathered[p], gathered[0])]


def check_hosts_agree(config_digest: str, data) -> None:
  """Raises on every host unless all hosts hold process 0's config (``config_digest``: its
  :func:`config_fingerprint`) and data.

  A collective call (it gathers ``config_digest`` and :func:`data_fingerprint`); on a single
  process it returns at once.

  Raises:
    ValueError: naming the processes whose config or data differ from process 0's.
  """
  if jax.process_count() == 1:
    return
  for what, digest in (("config", config_digest),
                       ("data", data_fingerprint(data))):
    differing = _hosts_differing(digest)
    if differing:
      raise ValueError(
          f"process(es) {differing} see a different {what} from process 0 (this is process "
          f"{jax.process_index()}, {what} sha256 {digest[:12]}). Start every host with the "
          "same command and the same data files; only "
          f"{', '.join(HOST_LOCAL_FIELDS)} may differ.")


def check_same_checkpoints(steps, directory: str) -> None:
  """Raises on every host unless all hosts list process 0's checkpoint ``steps``.

  A host that saw no checkpoint would start from step 0 while the others resume, and
  the first ``pmap``ped step would mix two runs; this happens when ``--workdir`` is a
  local folder on each host instead of one shared folder. A collective call; on a single
  process it returns at once.

  Raises:
    ValueError: naming the processes whose ``directory`` lists other steps.
  """
  if jax.process_count() == 1:
    return
  listed = json.dumps(sorted(int(s) for s in steps))
  differing = _hosts_differing(hashlib.sha256(listed.encode()).hexdigest())
  if differing:
    raise ValueError(
        f"process(es) {differing} see other checkpoints in {directory} than process 0 (this "
        f"is process {jax.process_index()}, which sees steps {listed}). --workdir must be one "
        "folder that every host reads and writes (a shared file system), not a local one.")


def hex_id_from_process_0(run_id: str, where: str) -> str:
  """``run_id`` (32 hex digits) as process 0 has it, on every process; one process: as is.

  Raises:
    ValueError: ``run_id`` is not 32 hex digits, naming ``where`` (the file it came from).
  """
  if jax.process_count() == 1:
    return run_id
  try:
    words = np.frombuffer(bytes.fromhex(run_id), np.uint32)
  except ValueError:
    words = np.zeros(0, np.uint32)
  if words.size != 4:
    raise ValueError(f"{where}: run id {run_id!r} is not 32 hex digits")
  return np.asarray(multihost_utils.broadcast_one_to_all(words), np.uint32).tobytes().hex()
