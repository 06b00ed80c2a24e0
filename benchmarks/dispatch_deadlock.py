"""Whether an evaluation-style dispatch loop deadlocks XLA's CPU client with 2 devices.

    python benchmarks/dispatch_deadlock.py --runs 3 --load 2 --out benchmarks/results/cpu/dispatch_deadlock

Diagnostic for :class:`simpletron_jax.train_lib.InFlightLimit`. Each run is a child
process with 2 XLA CPU devices that dispatches, without waiting, a pmapped step whose
results are summed over devices by ``psum``, and adds each result into a running sum, as
``train_lib.evaluate`` does. The modes differ only in how they dispatch:

* ``tree_add``: ``jax.tree_util.tree_map(jnp.add, ...)``, 3 small computations per batch,
  no limit (``evaluate`` before the fix);
* ``jit_add``: one jitted add per batch, no limit;
* ``limited``: one jitted add per batch and ``InFlightLimit`` (``evaluate`` now).

While the children run, ``--load`` busy processes keep the cores occupied, as a second
pytest worker does. XLA's rendezvous termination timeout is shortened to ``--timeout``
seconds (XLA's default is 40 s), so a deadlock ends the child with "Termination timeout"
and SIGABRT, some seconds after the timeout. Writes ``dispatch_deadlock.md`` and ``.json`` to ``--out``.
"""

import argparse
import json
import multiprocessing
import os
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("tree_add", "jit_add", "limited")


def child(mode: str, batches: int, repeats: int) -> None:
  """The dispatch loop of one run (in its own process, 2 CPU devices)."""
  sys.path.insert(0, ROOT)
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel

  from simpletron_jax import evaluation, train_lib  # pylint: disable=import-outside-toplevel

  def step(x):
    y = jnp.tanh(x @ x.T).sum()
    return {k: jax.lax.psum(y * i, "batch") for i, k in enumerate(("loss", "correct", "count"))}

  p_step = jax.pmap(step, axis_name="batch")
  x = np.ones((2, 64, 64), np.float32)
  for _ in range(repeats):
    total, in_flight = None, train_lib.InFlightLimit()
    for _ in range(batches):
      sums = p_step(x)
      if total is None:
        total = sums
      elif mode == "tree_add":
        total = jax.tree_util.tree_map(jnp.add, total, sums)
      else:
        total = evaluation._add_trees(total, sums)  # pylint: disable=protected-access
      if mode == "limited":
        in_flight.add(total)
    jax.block_until_ready(total)


def _busy(seconds: float) -> None:
  end = time.time() + seconds
  while time.time() < end:
    pass


def main() -> None:
  """Runs ``--runs`` children per mode under load; prints and writes the table."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
  parser.add_argument("--runs", type=int, default=3, help="children per mode")
  parser.add_argument("--load", type=int, default=2, help="busy processes beside them")
  parser.add_argument("--timeout", type=int, default=10,
                      help="XLA's rendezvous termination timeout, seconds")
  parser.add_argument("--batches", type=int, default=300, help="batches per loop")
  parser.add_argument("--repeats", type=int, default=20, help="loops per child")
  parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks/results/cpu/dispatch_deadlock"))
  parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    child(args.child, args.batches, args.repeats)
    return

  env = dict(os.environ, XLA_FLAGS=(
      "--xla_force_host_platform_device_count=2 "
      f"--xla_cpu_collective_call_terminate_timeout_seconds={args.timeout}"),
      JAX_PLATFORMS="cpu")
  rows = []
  for mode in MODES:
    for run in range(args.runs):
      load = [multiprocessing.Process(target=_busy, args=(args.timeout + 60,), daemon=True)
              for _ in range(args.load)]
      for p in load:
        p.start()
      start = time.time()
      proc = subprocess.run(
          [sys.executable, os.path.abspath(__file__), "--child", mode, "--batches",
           str(args.batches), "--repeats", str(args.repeats)],
          env=env, capture_output=True, text=True, timeout=args.timeout + 600, check=False)
      seconds = time.time() - start
      for p in load:
        p.terminate()
        p.join()
      deadlock = "Termination timeout" in proc.stderr
      rows.append({"mode": mode, "run": run, "returncode": proc.returncode,
                   "deadlocked": deadlock, "seconds": round(seconds, 1)})
      print(f"{mode:9s} run {run}: exit {proc.returncode}, "
            f"{'DEADLOCK' if deadlock else 'finished'} after {seconds:.1f} s", flush=True)
      if proc.returncode and not deadlock:
        print(proc.stderr[-2000:], file=sys.stderr)

  command = shlex.join(["python", os.path.relpath(os.path.abspath(__file__), ROOT),
                        *sys.argv[1:]])
  lines = ["# Dispatch deadlock on 2 XLA CPU devices\n", f"Command: `{command}`\n",
           f"{args.batches} batches x {args.repeats} loops per child, {args.load} busy "
           f"processes beside it, rendezvous termination timeout {args.timeout} s.\n",
           "| mode | runs | deadlocked | finished: median seconds |", "|---|---|---|---|"]
  for mode in MODES:
    mine = [r for r in rows if r["mode"] == mode]
    done = sorted(r["seconds"] for r in mine if r["returncode"] == 0)
    median = f"{done[len(done) // 2]:.1f}" if done else "-"
    lines.append(f"| `{mode}` | {len(mine)} | {sum(r['deadlocked'] for r in mine)} | {median} |")
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "dispatch_deadlock.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  with open(os.path.join(args.out, "dispatch_deadlock.json"), "w") as f:
    json.dump({"command": command, "jax": _jax_version(), "rows": rows}, f, indent=1)
  print("\n".join(lines))
  failed = [r for r in rows if r["returncode"] and not r["deadlocked"]]
  if failed:
    sys.exit(f"{len(failed)} child(ren) failed for another reason (stderr above)")


def _jax_version() -> str:
  out = subprocess.run([sys.executable, "-c", "import jax; print(jax.__version__)"],
                       capture_output=True, text=True, check=False)
  return out.stdout.strip()


if __name__ == "__main__":
  main()
