"""The attention op alone (forward and backward) and the dropout mask, timed: issue 10's
measurements for choosing Simple's layout and a cheaper dropout before either is changed.

    python benchmarks/attention_op.py --dtype bfloat16                 # GPU: 1K, 4K, 16K
    python benchmarks/attention_op.py --quick                          # CPU: a check, 256..1K

Attention ops. Inputs are ``q, k, v`` of ``[B, L, H, K]`` (issue 10's shapes: B 32, H 4,
K 64) and a right-padded mask whose rows keep between half and all of the L positions.
Each op runs as one jitted call that returns ``y`` and the gradients of ``<y, dy>`` with
respect to ``q, k, v`` (forward and backward):

* ``softmax_einsum``: ``softmax.einsum_attention``, LRA's explicit ``[B, H, L, L]`` form;
* ``softmax_xla``: ``jax.nn.dot_product_attention(implementation="xla")`` with the mask;
* ``softmax_flash``: ``softmax.flash_attention`` (cuDNN, key lengths from the mask); only
  where cuDNN runs (a GPU, bfloat16 or float16), else recorded as ``skipped`` with the reason;
* ``simple``: ``simple.simple_attention`` as the model runs it by default (``[B, L, H, K]``
  einsums; ``heads_first=True`` is ``simple_bhlk`` plus three transposes);
* ``simple_f32kv`` (candidate): the same function with ``K^T V`` and ``Q (K^T V)`` accumulated
  and kept in float32 (``preferred_element_type``), the output cast back to the input dtype;
* ``simple_bhlk`` (candidate): the same function on ``[B, H, L, K]`` inputs and output, the
  layout whose einsums need no transposes (the transposes are done once, outside the timing).

Dropout masks, on ``x`` of ``[B, L, E]`` (``E = H K``, an encoder activation), rate 0.1, each
as one jitted call of ``x * mask / keep``:

* ``bernoulli``: ``jax.random.bernoulli`` with the default (threefry) key, what flax's
  ``nn.Dropout`` does;
* ``bernoulli_rbg``: the same with an ``rbg`` key;
* ``bits16``: ``layers.PackedDropout`` (``model.dropout_mask_bits=16``): one 32-bit random
  word per two elements, each 16-bit half kept when below ``round(keep * 2^16)`` (keep
  probability 0.899994 for 0.9).

Timing: compile, one warm-up call, then ``--rounds`` runs of ``--steps`` back-to-back calls
that block once per run; the median time per call, in milliseconds. Memory: the compiled
call's ``memory_analysis()`` (arguments + outputs + temporaries - aliased); a call whose
estimate exceeds the device's ``bytes_limit`` is recorded as ``OOM`` without running.

Writes ``attention_op.json`` and ``attention_op.md`` to ``--out`` (default
``runs/benchmarks/<device>/``; the committed ones only when named: ``--out
'benchmarks/results/{device}'``). The three Simple forms compute the same function, and so
do the three softmax forms: ``tests/test_speed_memory.py`` checks that on CPU in float32.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import speed_memory as sm  # noqa: E402
from simpletron_jax import layers  # noqa: E402
from simpletron_jax.attention import simple, softmax  # noqa: E402

SOFTMAX_OPS = ("softmax_einsum", "softmax_xla", "softmax_flash")
SIMPLE_OPS = ("simple", "simple_f32kv", "simple_bhlk")
OPS = SOFTMAX_OPS + SIMPLE_OPS
DROPOUT_METHODS = ("bernoulli", "bernoulli_rbg", "bits16")
DEFAULT_LENGTHS = (1024, 4096, 16384)
QUICK_LENGTHS = (256, 1024)
DROPOUT_RATE = 0.1


def _simple_f32kv(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask_BxL):
  """Candidate: ``simple.simple_attention`` (normalizer "real", pads masked) with both
  products accumulated and kept in float32; output in the input dtype."""
  m_BxLx1x1 = mask_BxL[:, :, None, None].astype(q_BxLxHxK.dtype)
  q, k, v = q_BxLxHxK * m_BxLx1x1, k_BxLxHxK * m_BxLx1x1, v_BxLxHxK * m_BxLx1x1
  kv_BxHxKxK = jnp.einsum("blhd,blhe->bhde", k, v, preferred_element_type=jnp.float32)
  y_BxLxHxK = jnp.einsum("blhd,bhde->blhe", q.astype(jnp.float32), kv_BxHxKxK)
  n_B = jnp.maximum(mask_BxL.sum(axis=-1), 1).astype(jnp.float32)
  return (y_BxLxHxK / jnp.sqrt(n_B)[:, None, None, None]).astype(q_BxLxHxK.dtype)


def _simple_bhlk(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, mask_BxL):
  """Candidate: ``simple.simple_attention``'s function on ``[B, H, L, K]`` arrays."""
  m_Bx1xLx1 = mask_BxL[:, None, :, None].astype(q_BxHxLxK.dtype)
  q, k, v = q_BxHxLxK * m_Bx1xLx1, k_BxHxLxK * m_Bx1xLx1, v_BxHxLxK * m_Bx1xLx1
  kv_BxHxKxK = jnp.einsum("bhld,bhle->bhde", k, v)
  y_BxHxLxK = jnp.einsum("bhld,bhde->bhle", q, kv_BxHxKxK)
  n_B = jnp.maximum(mask_BxL.sum(axis=-1), 1).astype(y_BxHxLxK.dtype)
  return y_BxHxLxK / jnp.sqrt(n_B)[:, None, None, None]


def _keep(mask_BxL):
  return mask_BxL[:, None, None, :]


def attention_fn(op: str) -> Callable:
  """``(q, k, v, mask_BxL) -> y`` for ``op`` (one of :data:`OPS`); ``simple_bhlk`` takes and
  returns ``[B, H, L, K]``, the others ``[B, L, H, K]``.

  Raises:
    ValueError: for an unknown op.
  """
  table = {
      "softmax_einsum": lambda q, k, v, m: softmax.einsum_attention(q, k, v, _keep(m)),
      "softmax_xla": lambda q, k, v, m: jax.nn.dot_product_attention(
          q, k, v, mask=_keep(m), implementation="xla"),
      "softmax_flash": lambda q, k, v, m: softmax.flash_attention(q, k, v, m, causal=False),
      "simple": simple.simple_attention,
      "simple_f32kv": _simple_f32kv,
      "simple_bhlk": _simple_bhlk,
  }
  if op not in table:
    raise ValueError(f"unknown attention op {op!r}; expected one of {OPS}")
  return table[op]


def forward_backward(op: str) -> Callable:
  """``(q, k, v, mask, dy) -> (y, (dq, dk, dv))``: ``op``'s output and the vector-Jacobian
  product with the cotangent ``dy`` (same shapes as q, k, v and y)."""
  fn = attention_fn(op)

  def step(q, k, v, mask, dy):
    y, vjp = jax.vjp(lambda q_, k_, v_: fn(q_, k_, v_, mask), q, k, v)
    return y, vjp(dy)
  return step


def inputs(batch: int, length: int, heads: int, head_dim: int, dtype: str, seed: int = 0):
  """Random ``q, k, v, dy`` (``[B, L, H, K]``, unit normal, in ``dtype``) and a right-padded
  ``mask_BxL`` whose rows keep ``L/2`` to ``L`` positions (row 0 keeps all)."""
  rng = np.random.default_rng(seed)
  q, k, v, dy = (jnp.asarray(rng.standard_normal((batch, length, heads, head_dim)),
                             dtype) for _ in range(4))
  lengths = rng.integers(length // 2, length + 1, batch)
  lengths[0] = length
  mask_BxL = jnp.asarray(np.arange(length)[None, :] < lengths[:, None])
  return q, k, v, dy, mask_BxL


def dropout_fn(method: str, rate: float = DROPOUT_RATE) -> Callable:
  """``(x, key) -> x * mask / keep`` with ``mask`` drawn by ``method`` (one of
  :data:`DROPOUT_METHODS`); ``key`` is a ``jax.random.key`` of the method's PRNG impl.

  Raises:
    ValueError: for an unknown method.
  """
  keep = 1.0 - rate
  if method in ("bernoulli", "bernoulli_rbg"):
    def drop(x, key):
      mask = jax.random.bernoulli(key, keep, x.shape)
      return jnp.where(mask, x / jnp.asarray(keep, x.dtype), jnp.zeros((), x.dtype))
    return drop
  if method == "bits16":
    def drop16(x, key):   # the model's model.dropout_mask_bits=16
      return layers.PackedDropout(rate).apply({}, x, deterministic=False,
                                              rngs={"dropout": key})
    return drop16
  raise ValueError(f"unknown dropout method {method!r}; expected one of {DROPOUT_METHODS}")


def _time(compiled, args, steps: int, rounds: int) -> list[float]:
  jax.block_until_ready(compiled(*args))
  times = []
  for _ in range(rounds):
    start = time.perf_counter()
    for _ in range(steps):
      out = compiled(*args)
    jax.block_until_ready(out)
    times.append((time.perf_counter() - start) / steps)
  return times


def _measure(name: str, length: int, fn: Callable, args: tuple, steps: int, rounds: int,
             limit_bytes: float | None) -> dict[str, Any]:
  """Compiles and times ``fn(*args)``; a record with ``status`` ok, OOM or error."""
  record: dict[str, Any] = {"name": name, "length": length, "status": "ok"}
  try:
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    record["compile_s"] = time.perf_counter() - start
    memory = sm._memory_analysis(compiled)  # pylint: disable=protected-access
    record["memory_bytes"] = memory["estimate_bytes"] if memory else None
    if limit_bytes and record["memory_bytes"] and record["memory_bytes"] > limit_bytes:
      record["status"] = "OOM"
      record["reason"] = (f"memory_analysis estimate {record['memory_bytes'] / sm.GIB:.1f} GiB"
                          f" > limit {limit_bytes / sm.GIB:.1f} GiB")
      return record
    times = _time(compiled, args, steps, rounds)
    record["ms"] = 1e3 * statistics.median(times)
    record["ms_rounds"] = [1e3 * t for t in times]
  except Exception as error:  # noqa: BLE001  (an op that cannot run is a table cell, not a crash)
    record["status"] = "OOM" if sm._is_oom(error) else "error"  # pylint: disable=protected-access
    record["reason"] = sm._first_line(error)  # pylint: disable=protected-access
  return record


def flash_unavailable(dtype: str, head_dim: int) -> str:
  """Why ``softmax_flash`` cannot run here ("" if it can), as the model decides it."""
  impl, reason = softmax.resolve_implementation("flash", backend=jax.default_backend(),
                                                dtype=dtype, head_dim=head_dim,
                                                dropout_active=False)
  return "" if impl == "flash" else reason


def run(lengths, batch: int, heads: int, head_dim: int, dtype: str, steps: int, rounds: int,
        ops=OPS, dropout_methods=DROPOUT_METHODS, max_memory_gb: float | None = None,
        log: Callable[[str], None] = print) -> dict[str, Any]:
  """Measures every op and dropout method at every length.

  Returns:
    A JSON-ready dict: ``settings``, ``machine`` (device and versions, no matmul peak),
    ``attention`` and ``dropout`` (lists of records ``{name, length, status, ms,
    ms_rounds, memory_bytes, compile_s, reason}``).
  """
  device = jax.local_devices()[0]
  stats = sm._memory_stats(device)  # pylint: disable=protected-access
  limit = (max_memory_gb * sm.GIB if max_memory_gb
           else (stats or {}).get("bytes_limit") if device.platform != "cpu" else None)
  no_flash = flash_unavailable(dtype, head_dim)
  attention, dropout = [], []
  for length in lengths:
    q, k, v, dy, mask = inputs(batch, length, heads, head_dim, dtype)
    bhlk = tuple(jnp.swapaxes(t, 1, 2) for t in (q, k, v, dy))
    for op in ops:
      if op == "softmax_flash" and no_flash:
        record = {"name": op, "length": length, "status": "skipped", "reason": no_flash}
      else:
        args = ((*bhlk[:3], mask, bhlk[3]) if op == "simple_bhlk" else (q, k, v, mask, dy))
        record = _measure(op, length, forward_backward(op), args, steps, rounds, limit)
      attention.append(record)
      log(_line(record))
    x = jnp.reshape(q, (batch, length, heads * head_dim))
    for method in dropout_methods:
      key = jax.random.key(0, impl="rbg" if method == "bernoulli_rbg" else None)
      record = _measure(method, length, dropout_fn(method), (x, key), steps, rounds, limit)
      dropout.append(record)
      log(_line(record))
  return {
      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "settings": {"lengths": list(lengths), "batch": batch, "heads": heads,
                   "head_dim": head_dim, "dtype": dtype, "steps": steps, "rounds": rounds,
                   "dropout_rate": DROPOUT_RATE, "memory_limit_bytes": limit},
      "machine": {"platform": device.platform, "device_kind": device.device_kind,
                  "jax": jax.__version__,
                  "device_slug": ("cpu" if device.platform == "cpu"
                                  else sm.slugify(device.device_kind))},
      "attention": attention, "dropout": dropout,
  }


def _line(record: dict[str, Any]) -> str:
  if record["status"] != "ok":
    return f"{record['name']:<16} L={record['length']:<6} {record['status']}: " \
           f"{record.get('reason', '')}"
  return (f"{record['name']:<16} L={record['length']:<6} {record['ms']:9.3f} ms, "
          f"{(record['memory_bytes'] or 0) / sm.GIB:6.2f} GiB, compile {record['compile_s']:.1f} s")


def _table(records: list[dict[str, Any]], names, lengths, reference=None) -> list[str]:
  """Markdown rows: ms per call, with the ratio to the fastest of ``reference`` per length."""
  cells = {(r["name"], r["length"]): r for r in records}
  best = {}
  for length in lengths:
    times = [cells[(n, length)]["ms"] for n in (reference or ())
             if cells.get((n, length), {}).get("status") == "ok"]
    best[length] = min(times) if times else None
  rows = ["| op | " + " | ".join(f"L={n}" for n in lengths) + " |",
          "|---|" + "---|" * len(lengths)]
  for name in names:
    out = []
    for length in lengths:
      r = cells.get((name, length))
      if r is None:
        out.append("")
      elif r["status"] != "ok":
        out.append(r["status"])
      else:
        ratio = f" ({best[length] / r['ms']:.2f}x)" if best[length] else ""
        out.append(f"{r['ms']:.3g} ms{ratio}, {(r['memory_bytes'] or 0) / sm.GIB:.2f} GiB")
    rows.append(f"| `{name}` | " + " | ".join(out) + " |")
  return rows


def markdown_report(payload: dict[str, Any], command: str) -> str:
  """The ``attention_op.md`` text: the two tables and the settings."""
  s, m = payload["settings"], payload["machine"]
  lengths = s["lengths"]
  names = [n for n in OPS if any(r["name"] == n for r in payload["attention"])]
  methods = [n for n in DROPOUT_METHODS if any(r["name"] == n for r in payload["dropout"])]
  lines = [
      "# The attention op alone, and dropout masks", "",
      f"Device: {m['device_kind']} ({m['platform']}); jax {m['jax']}. Created "
      f"{payload['created']}. Command: `{command}`", "",
      f"B {s['batch']}, H {s['heads']}, K {s['head_dim']}, {s['dtype']}; median of "
      f"{s['rounds']} runs of {s['steps']} calls. Memory: `memory_analysis()` of the call.", "",
      "## Attention, forward and backward (speed-up vs the fastest softmax)", "",
      *_table(payload["attention"], names, lengths, SOFTMAX_OPS), "",
      f"## Dropout mask and scale on [B, L, {s['heads'] * s['head_dim']}], rate "
      f"{s['dropout_rate']} (speed-up vs `bernoulli`)", "",
      *_table(payload["dropout"], methods, lengths, ("bernoulli",)), ""]
  notes = sorted({f"`{r['name']}` L={r['length']}: {r['status']}, {r['reason']}"
                  for r in payload["attention"] + payload["dropout"] if r.get("reason")})
  if notes:
    lines += ["Not measured:", ""] + [f"- {n}" for n in notes] + [""]
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
  """Command line: see the module docstring.

  Raises:
    SystemExit: (after writing the outputs) if not a single cell could be measured.
  """
  parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
  parser.add_argument("--lengths", nargs="+", type=int, default=None,
                      help=f"default {DEFAULT_LENGTHS}; --quick: {QUICK_LENGTHS}")
  parser.add_argument("--batch", type=int, default=None, help="default 32; --quick: 2")
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--head-dim", type=int, default=64)
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
  parser.add_argument("--steps", type=int, default=10, help="calls per timed run")
  parser.add_argument("--rounds", type=int, default=5, help="timed runs per cell")
  parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
  parser.add_argument("--dropout", nargs="*", choices=DROPOUT_METHODS,
                      default=list(DROPOUT_METHODS))
  parser.add_argument("--max-memory-gb", type=float, default=None,
                      help="record a cell as OOM above this estimate (default: the device's "
                      "bytes_limit; none on CPU)")
  parser.add_argument("--quick", action="store_true", help="CPU check: lengths 256 and 1024, "
                      "batch 2, 2 runs of 2 calls")
  parser.add_argument("--cache-dir", default="", help="persistent compilation cache folder")
  parser.add_argument("--out", default=None,
                      help="output folder, '{device}' replaced by the device (default "
                      "runs/benchmarks/<device>/; the committed ones: --out "
                      "benchmarks/results/{device})")
  args = parser.parse_args(argv)
  if args.quick:
    args.steps, args.rounds = min(args.steps, 2), min(args.rounds, 2)
  sm.enable_compilation_cache(args.cache_dir)
  payload = run(args.lengths or (QUICK_LENGTHS if args.quick else DEFAULT_LENGTHS),
                args.batch or (2 if args.quick else 32), args.heads, args.head_dim, args.dtype,
                args.steps, args.rounds, args.ops, args.dropout, args.max_memory_gb)
  out = (args.out or os.path.join(os.path.dirname(HERE), "runs", "benchmarks", "{device}")
         ).replace("{device}", payload["machine"]["device_slug"])
  os.makedirs(out, exist_ok=True)
  command = "python benchmarks/attention_op.py " + " ".join(argv if argv is not None
                                                            else sys.argv[1:])
  with open(os.path.join(out, "attention_op.json"), "w") as f:
    json.dump(payload, f, indent=2)
  text = markdown_report(payload, command.strip())
  with open(os.path.join(out, "attention_op.md"), "w") as f:
    f.write(text)
  print(text)
  if not any(r["status"] == "ok" for r in payload["attention"] + payload["dropout"]):
    raise SystemExit(f"attention_op: no cell could be measured; the reasons are in {out}/"
                     "attention_op.md")
  return payload


if __name__ == "__main__":
  main()
