"""The PyTorch reference: the benchmark's LRA text model in PyTorch, trained step by step.

    python benchmarks/torch_step.py --dtype bfloat16 --lengths 1024 4096 16384 \
        --jax_results benchmarks/results/<device>/speed_memory.json --out /tmp/torch_step
    python benchmarks/torch_step.py --lengths 64 128 --batch 2 --modes eager   # CPU

Speed is judged against the fastest alternative a user has, and for softmax attention on a
GPU that includes PyTorch's ``scaled_dot_product_attention`` (flash attention). This script
trains the model of :mod:`speed_memory` (LRA's byte-level text classifier: 4 layers, emb 256,
4 heads, qkv 256, mlp 1024, byte vocabulary 257, 2 classes, CLS pooling, sinusoidal positions,
dropout 0.1 (``--dropout``), AdamW) written in PyTorch, so that its rows and the JAX rows come
from one device call. Two attentions:

* ``softmax``: ``torch.nn.functional.scaled_dot_product_attention`` (PyTorch picks the
  kernel: flash attention or cuDNN on an H100 when no mask is given), then the output
  projection. Without attention dropout by default (``--attention_dropout``), like
  ``speed_memory``'s ``softmax_flash`` row.
* ``simple``: SimpleTRON's ``Q (K^T V) / sqrt(n)`` with two ``torch.einsum`` calls, ``n`` the
  real tokens (CLS included), no output projection: the function of
  :func:`simpletron_jax.model.attention.simple.simple_attention`.

Each runs ``eager`` and ``compile`` (``torch.compile`` of the forward and loss, static shapes,
one fresh compile per cell) in ``--modes``. The function is the JAX model's:
``tests/test_torch_reference.py`` loads the JAX parameters with :func:`load_flax_params` and
checks that logits and every gradient match in float32 on CPU, with padding. ``bfloat16`` runs
under ``torch.autocast`` (parameters, optimizer state and the loss in float32; matmuls in
bfloat16), the counterpart of ``model.dtype = "bfloat16"``. The optimizer is
``torch.optim.AdamW`` (LRA's b1 0.9, b2 0.98, eps 1e-9, weight decay 0.1; the fused kernel on a
GPU) at a constant learning rate, since the schedule costs nothing measurable.

Timing is :mod:`speed_memory`'s: the same random full-length byte batch (no padding, so no
mask is passed), resident on the device; a warm-up step (in ``compile`` mode it compiles,
``compile_s``); with ``--run_seconds`` a probe step; then ``--rounds`` runs of ``--steps``
back-to-back steps, synchronised once per run; the median per-step time is reported. Peak
memory is ``torch.cuda.max_memory_allocated`` over the cell (None on CPU). A cell that runs out
of memory is recorded as ``OOM`` and that row's longer lengths are skipped.

With ``--jax_results`` (a ``speed_memory.json`` measured just before on the same machine, in
the same device call on a GPU) the report adds the JAX rows and each JAX row's speed against
the fastest PyTorch softmax and against PyTorch's ``simple`` at each length. Writes
``torch_step.json`` (settings, machine, every record) and ``torch_step.md`` to ``--out``. JAX is
imported (for the data and the sinusoidal table) but never initialises a device, so it holds no
GPU memory.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from simpletron_jax.runtime import cli  # noqa: E402

ATTENTIONS = ("softmax", "simple")
MODES = ("eager", "compile")
# The benchmark model (speed_memory.lra_text_config; a test keeps the two equal).
MODEL = {"emb_dim": 256, "num_heads": 4, "qkv_dim": 256, "mlp_dim": 1024, "num_layers": 4,
         "dropout_rate": 0.1}
LEARNING_RATE = 1e-4
ADAM = {"betas": (0.9, 0.98), "eps": 1e-9, "weight_decay": 0.1}
GIB = 2.0 ** 30


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  """The command-line flags (see the module docstring)."""
  parser = cli.ArgumentParser(prog="torch_step.py", description=__doc__.split("\n", maxsplit=1)[0])
  parser.add_argument("--attentions", nargs="+", default=list(ATTENTIONS), choices=ATTENTIONS)
  parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
  parser.add_argument("--lengths", nargs="+", type=int, default=[1024, 4096, 16384])
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
  parser.add_argument("--steps", type=int, default=10, help="steps per timed run (at most)")
  parser.add_argument("--rounds", type=int, default=3, help="timed runs per cell")
  parser.add_argument("--run_seconds", type=float, default=0.0,
                      help="cut a slow cell's runs to about this many seconds (0: off)")
  parser.add_argument("--dropout", type=float, default=MODEL["dropout_rate"],
                      help="embedding, residual and MLP dropout (speed_memory's "
                      "--set dropout_rate=...)")
  parser.add_argument("--attention_dropout", type=float, default=0.0,
                      help="softmax's attention dropout (0: as speed_memory's softmax_flash)")
  parser.add_argument("--compile_mode", default="default",
                      choices=("default", "reduce-overhead", "max-autotune"),
                      help="torch.compile's mode for the compile rows")
  parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
  parser.add_argument("--jax_results", default=None,
                      help="a speed_memory.json measured just before on the same machine, for "
                      "the ratios")
  parser.add_argument("--out", default="/tmp/torch_step")
  args = parser.parse_args(argv)
  for flag, value in (("--batch", args.batch), ("--steps", args.steps),
                      ("--rounds", args.rounds)):
    if value < 1:
      parser.error(f"{flag} must be at least 1, got {value}")
  if min(args.lengths) < 1:
    parser.error(f"--lengths must be positive, got {args.lengths}")
  for flag, rate in (("--dropout", args.dropout), ("--attention_dropout",
                                                   args.attention_dropout)):
    if not 0.0 <= rate < 1.0:
      parser.error(f"{flag} must be in [0, 1), got {rate}")
  return args


if __name__ == "__main__":
  # The flags first: --help and a bad invocation end here, before the imports below load
  # PyTorch and JAX.
  _ARGS = parse_args()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import speed_memory  # noqa: E402
import step_time  # noqa: E402
from simpletron_jax.model import layers, model_config  # noqa: E402


class Attention(nn.Module):
  """Multi-head ``softmax`` (SDPA, then an output projection) or ``simple`` attention.

  Args:
    kind: ``"softmax"`` or ``"simple"``.
    emb_dim, num_heads, qkv_dim: E, H and D (head width ``K = D / H``).
    dropout_rate: attention dropout of ``softmax`` in training (SDPA's ``dropout_p``).

  Call: ``(x_BxLxE, mask_BxL bool | None) -> [B, L, E]``; ``mask_BxL`` True for real tokens,
  None for no padding. Pads are never keys; ``simple`` zeroes Q, K and V at pads and divides by
  ``sqrt`` of each row's real tokens (``simpletron_jax.model.attention.simple``), ``softmax`` scales
  by ``1 / sqrt(K)`` (LRA's ``dot_product_attention``).

  Raises:
    ValueError: for an unknown ``kind``, ``qkv_dim`` not divisible by ``num_heads``, or
      ``simple`` with ``qkv_dim != emb_dim`` (it has no output projection).
  """

  def __init__(self, kind: str, emb_dim: int, num_heads: int, qkv_dim: int,
               dropout_rate: float = 0.0):
    super().__init__()
    if kind not in ATTENTIONS:
      raise ValueError(f"attention {kind!r}; expected one of {ATTENTIONS}")
    if qkv_dim % num_heads:
      raise ValueError(f"qkv_dim={qkv_dim} is not divisible by num_heads={num_heads}")
    if kind == "simple" and qkv_dim != emb_dim:
      raise ValueError(f"simple has no output projection: qkv_dim={qkv_dim} must equal "
                       f"emb_dim={emb_dim}")
    self.kind, self.num_heads, self.dropout_rate = kind, num_heads, dropout_rate
    # No biases on the attention projections, as LRA (model.attention_bias=False).
    self.query, self.key, self.value = (nn.Linear(emb_dim, qkv_dim, bias=False)
                                        for _ in range(3))
    self.out = nn.Linear(qkv_dim, emb_dim, bias=False) if kind == "softmax" else None

  def forward(self, x_BxLxE: torch.Tensor, mask_BxL: torch.Tensor | None) -> torch.Tensor:
    b, length, _ = x_BxLxE.shape
    heads = (b, length, self.num_heads, -1)
    q, k, v = (proj(x_BxLxE).view(heads) for proj in (self.query, self.key, self.value))
    if self.kind == "softmax":
      keys_Bx1x1xL = None if mask_BxL is None else mask_BxL[:, None, None, :]
      y_BxHxLxK = F.scaled_dot_product_attention(
          q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=keys_Bx1x1xL,
          dropout_p=self.dropout_rate if self.training else 0.0)
      return self.out(y_BxHxLxK.transpose(1, 2).reshape(b, length, -1))
    if mask_BxL is None:
      n_Bx1x1x1 = torch.full((b, 1, 1, 1), float(length), device=x_BxLxE.device)
    else:
      m_BxLx1x1 = mask_BxL[:, :, None, None].to(q.dtype)
      q, k, v = q * m_BxLx1x1, k * m_BxLx1x1, v * m_BxLx1x1
      n_Bx1x1x1 = mask_BxL.sum(-1).clamp(min=1).to(torch.float32)[:, None, None, None]
    kv_BxHxKxK = torch.einsum("blhd,blhe->bhde", k, v)
    y_BxLxHxK = torch.einsum("blhd,bhde->blhe", q, kv_BxHxKxK) / n_Bx1x1x1.sqrt().to(q.dtype)
    return y_BxLxHxK.reshape(b, length, -1)


class Block(nn.Module):
  """LRA's pre-LN encoder block (``simpletron_jax.model.layers.EncoderBlock``)::

      x1 = x0 + Dropout(Attn(LN(x0)));  out = x1 + Dropout(Dense(Dropout(GELU(Dense(LN(x1))))))

  GELU is the tanh form (flax's ``nn.gelu`` default); LayerNorm epsilon 1e-6.

  Call: ``(x_BxLxE, mask_BxL | None) -> x_BxLxE``.
  """

  def __init__(self, kind: str, emb_dim: int, num_heads: int, qkv_dim: int, mlp_dim: int,
               dropout_rate: float, attention_dropout_rate: float):
    super().__init__()
    self.ln1 = nn.LayerNorm(emb_dim, eps=model_config.LN_EPSILON)
    self.attention = Attention(kind, emb_dim, num_heads, qkv_dim, attention_dropout_rate)
    self.ln2 = nn.LayerNorm(emb_dim, eps=model_config.LN_EPSILON)
    self.fc1, self.fc2 = nn.Linear(emb_dim, mlp_dim), nn.Linear(mlp_dim, emb_dim)
    self.dropout = nn.Dropout(dropout_rate)

  def forward(self, x_BxLxE: torch.Tensor, mask_BxL: torch.Tensor | None) -> torch.Tensor:
    x_BxLxE = x_BxLxE + self.dropout(self.attention(self.ln1(x_BxLxE), mask_BxL))
    y = self.dropout(F.gelu(self.fc1(self.ln2(x_BxLxE)), approximate="tanh"))
    return x_BxLxE + self.dropout(self.fc2(y))


class TextClassifier(nn.Module):
  """LRA's text classifier (``simpletron_jax.model.encoders.ClassificationEncoder`` with CLS
  pooling and sinusoidal positions): embedding, a zero-initialised CLS token in front,
  positions, embedding dropout, pre-LN blocks, final LayerNorm, the CLS state in float32, then
  Dense(mlp_dim) -> ReLU -> Dense(num_classes).

  Args:
    kind: the attention of every block, ``"softmax"`` or ``"simple"``.
    vocab_size: token ids in ``[0, vocab_size)``, 0 = pad.
    num_classes: labels.
    max_length: longest input in tokens, CLS excluded.
    emb_dim, num_heads, qkv_dim, mlp_dim, num_layers: sizes (LRA names).
    dropout_rate: embedding, residual and MLP dropout.
    attention_dropout_rate: ``softmax``'s attention dropout.

  Call: ``(tokens_BxL int64, mask_BxL bool | None) -> logits_BxC float32``; None: every token is
  real (no padding, as in the benchmark batch).

  Raises:
    ValueError: from :class:`Attention`; and when ``L > max_length``.
  """

  def __init__(self, kind: str, vocab_size: int, num_classes: int, max_length: int, *,
               emb_dim: int, num_heads: int, qkv_dim: int, mlp_dim: int, num_layers: int,
               dropout_rate: float = 0.1, attention_dropout_rate: float = 0.0):
    super().__init__()
    self.max_length = max_length
    self.embed = nn.Embedding(vocab_size, emb_dim)
    self.cls = nn.Parameter(torch.zeros(1, 1, emb_dim))
    self.register_buffer("pos_1xLxE", torch.from_numpy(
        layers.sinusoidal_table(max_length + 1, emb_dim))[None], persistent=False)
    self.dropout = nn.Dropout(dropout_rate)
    self.blocks = nn.ModuleList(
        Block(kind, emb_dim, num_heads, qkv_dim, mlp_dim, dropout_rate, attention_dropout_rate)
        for _ in range(num_layers))
    self.encoder_norm = nn.LayerNorm(emb_dim, eps=model_config.LN_EPSILON)
    self.head_hidden = nn.Linear(emb_dim, mlp_dim)
    self.head_logits = nn.Linear(mlp_dim, num_classes)

  def forward(self, tokens_BxL: torch.Tensor, mask_BxL: torch.Tensor | None = None):
    b, length = tokens_BxL.shape
    if length > self.max_length:
      raise ValueError(f"{length} tokens exceed max_length={self.max_length}")
    x_BxLxE = torch.cat([self.cls.expand(b, 1, -1), self.embed(tokens_BxL)], dim=1)
    x_BxLxE = self.dropout(x_BxLxE + self.pos_1xLxE[:, :length + 1])
    if mask_BxL is not None:
      mask_BxL = torch.cat([torch.ones_like(mask_BxL[:, :1]), mask_BxL.bool()], dim=1)
    for block in self.blocks:
      x_BxLxE = block(x_BxLxE, mask_BxL)
    pooled_BxE = self.encoder_norm(x_BxLxE)[:, 0].float()
    return self.head_logits(F.relu(self.head_hidden(pooled_BxE)))


def load_flax_params(model: TextClassifier, params: dict[str, Any]) -> None:
  """Copies the parameters of the JAX
  :class:`simpletron_jax.model.encoders.ClassificationEncoder` into ``model`` (same sizes and
  attention), in place.

  Flax kernels are ``[in, out]`` (attention: ``[E, H, K]`` and ``[H, K, E]``); torch weights
  are ``[out, in]``.

  Args:
    model: the PyTorch model.
    params: the flax ``params`` tree (numpy or JAX arrays).

  Raises:
    KeyError: a parameter missing from ``params``; ValueError: a shape that does not fit.
  """
  def put(target: torch.Tensor, value) -> None:
    array = np.asarray(value, np.float32)
    if array.size != target.numel():
      raise ValueError(f"flax shape {array.shape} does not fit torch {tuple(target.shape)}")
    with torch.no_grad():
      target.copy_(torch.tensor(array.reshape(target.shape)))

  def dense(linear: nn.Linear, tree) -> None:
    kernel = np.asarray(tree["kernel"], np.float32)   # [E, H, K], [H, K, E] or [in, out]
    if kernel.size != linear.weight.numel():
      raise ValueError(f"flax kernel {kernel.shape} does not fit torch "
                       f"{tuple(linear.weight.shape)}")
    put(linear.weight, kernel.reshape(linear.in_features, linear.out_features).T)
    if linear.bias is not None:
      put(linear.bias, tree["bias"])

  def norm(layer: nn.LayerNorm, tree) -> None:
    put(layer.weight, tree["scale"])
    put(layer.bias, tree["bias"])

  encoder = params["encoder"]
  put(model.embed.weight, encoder["embed"]["embedding"])
  put(model.cls, encoder["cls"])
  for i, block in enumerate(model.blocks):
    tree = encoder[f"encoderblock_{i}"]
    norm(block.ln1, tree["LayerNorm_0"])
    norm(block.ln2, tree["LayerNorm_1"])
    for name in ("query", "key", "value"):
      dense(getattr(block.attention, name), tree["attention"][name])
    if block.attention.out is not None:
      dense(block.attention.out, tree["attention"]["out"])
    dense(block.fc1, tree["MlpBlock_0"]["Dense_0"])
    dense(block.fc2, tree["MlpBlock_0"]["Dense_1"])
  norm(model.encoder_norm, encoder["encoder_norm"])
  dense(model.head_hidden, params["head_hidden"])
  dense(model.head_logits, params["head_logits"])


def make_step(model: TextClassifier, mode: str, dtype: str, device: torch.device,
              compile_mode: str = "default"
              ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
  """One training step of ``model``: forward, cross-entropy, backward, AdamW.

  Args:
    model: the model, on ``device``.
    mode: ``"eager"`` or ``"compile"`` (``torch.compile`` of forward and loss, static shapes).
    dtype: ``"float32"`` or ``"bfloat16"`` (``torch.autocast``).
    device: where the model lives.
    compile_mode: ``torch.compile``'s ``mode`` in ``compile`` mode: ``"default"``,
      ``"reduce-overhead"`` (CUDA graphs) or ``"max-autotune"``.

  Returns:
    ``step(tokens_BxL, targets_B) -> loss`` (a 0-d float32 tensor on the device).

  Raises:
    ValueError: for an unknown ``mode`` or ``dtype``.
  """
  if mode not in MODES:
    raise ValueError(f"mode {mode!r}; expected one of {MODES} (flag --modes)")
  if dtype not in ("float32", "bfloat16"):
    raise ValueError(f"dtype {dtype!r}; expected float32 or bfloat16 (flag --dtype)")
  optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE,
                                fused=device.type == "cuda", **ADAM)

  def loss_fn(tokens_BxL, targets_B):
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
      logits_BxC = model(tokens_BxL)
    return F.cross_entropy(logits_BxC.float(), targets_B)

  forward = (torch.compile(loss_fn, dynamic=False, mode=compile_mode) if mode == "compile"
             else loss_fn)

  def step(tokens_BxL, targets_B):
    loss = forward(tokens_BxL, targets_B)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()

  model.train()
  return step


def _synchronize(device: torch.device) -> None:
  if device.type == "cuda":
    torch.cuda.synchronize(device)


def measure(kind: str, mode: str, length: int, batch: int, dtype: str, steps: int, rounds: int,
            device: torch.device, run_seconds: float = 0.0, attention_dropout: float = 0.0,
            model_sizes: dict[str, Any] | None = None,
            compile_mode: str = "default") -> dict[str, Any]:
  """Steps/s and peak memory of one (attention, mode, length) cell.

  Args:
    kind: ``"softmax"`` or ``"simple"``.
    mode: ``"eager"`` or ``"compile"``.
    length: input tokens per example, CLS excluded.
    batch: examples per step.
    dtype: ``"float32"`` or ``"bfloat16"``.
    steps: steps per timed run (at most, with ``run_seconds``).
    rounds: timed runs; the median per-step time is reported.
    device: where to run.
    run_seconds: if > 0, a probe step is timed and each run gets
      :func:`speed_memory.steps_per_run` steps.
    attention_dropout: ``softmax``'s attention dropout.
    model_sizes: :data:`MODEL` fields to replace (tests shrink the model).
    compile_mode: see :func:`make_step`.

  Returns:
    A record: ``label`` (``torch_<kind>_<mode>``), ``status`` (``ok``, ``OOM`` or ``error``),
    ``reason``, ``compile_s`` (the warm-up step, seconds), ``median_s_per_step``,
    ``steps_per_sec``, ``step_times_s``, ``steps_per_run``, ``peak_bytes`` (CUDA only) and
    ``final_loss``; a failed cell has ``error_type``, and a non-finite final loss makes it an
    ``error``. Never raises for a failing cell.
  """
  record: dict[str, Any] = {"label": f"torch_{kind}_{mode}", "attention": kind, "mode": mode,
                            "length": length, "batch": batch, "status": "error", "reason": ""}
  model = step = tokens = targets = None
  try:
    torch.manual_seed(0)
    torch._dynamo.reset()   # one fresh compile per cell, no recompile limit across cells
    sizes = {**MODEL, **(model_sizes or {})}
    model = TextClassifier(kind, speed_memory.BYTE_VOCAB, speed_memory.NUM_CLASSES, length,
                           attention_dropout_rate=attention_dropout, **sizes).to(device)
    host = step_time.random_batch(np.random.default_rng(0), batch, length,
                                  speed_memory.BYTE_VOCAB, 1, speed_memory.NUM_CLASSES)
    tokens = torch.from_numpy(host["inputs"][0].astype(np.int64)).to(device)
    targets = torch.from_numpy(host["targets"][0].astype(np.int64)).to(device)
    step = make_step(model, mode, dtype, device, compile_mode)
    if device.type == "cuda":
      torch.cuda.empty_cache()
      torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    loss = step(tokens, targets)   # warm-up (compiles in compile mode)
    _synchronize(device)
    record["compile_s"] = time.perf_counter() - start
    n = steps
    if run_seconds > 0:
      start = time.perf_counter()
      loss = step(tokens, targets)
      _synchronize(device)
      record["probe_s"] = time.perf_counter() - start
      n = speed_memory.steps_per_run(steps, run_seconds, record["probe_s"])
    times = []
    for _ in range(rounds):
      start = time.perf_counter()
      for _ in range(n):
        loss = step(tokens, targets)
      _synchronize(device)
      times.append((time.perf_counter() - start) / n)
    median = statistics.median(times)
    if not math.isfinite(float(loss)):
      raise FloatingPointError(f"the loss after {1 + rounds * n} steps is {float(loss)}")
    record.update(status="ok", median_s_per_step=median, steps_per_sec=1.0 / median,
                  step_times_s=times, steps_per_run=n, final_loss=float(loss),
                  peak_bytes=(torch.cuda.max_memory_allocated(device)
                              if device.type == "cuda" else None))
  except Exception as error:  # noqa: BLE001  (any failure is this cell's result)
    record.update(status="OOM" if speed_memory._is_oom(error) else "error",
                  reason=speed_memory._first_line(error), error_type=type(error).__name__)
  finally:
    del model, step, tokens, targets
    if device.type == "cuda":
      torch.cuda.empty_cache()
  return record


def machine_info(device: torch.device) -> dict[str, Any]:
  """Torch version, device name, CUDA and cuDNN versions, and SDPA's enabled kernels."""
  info = {"torch": torch.__version__, "python": platform.python_version(),
          "platform": platform.platform(), "device_type": device.type,
          "device_name": platform.processor() or platform.machine(),
          "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
  if device.type == "cuda":
    info.update(device_name=torch.cuda.get_device_name(device), cuda=torch.version.cuda,
                cudnn=torch.backends.cudnn.version(),
                sdpa_enabled={name: getattr(torch.backends.cuda, f"{name}_sdp_enabled",
                                            lambda: None)()
                              for name in ("flash", "cudnn", "mem_efficient", "math")})
  return info


def run(kinds, modes, lengths, batch: int, dtype: str, steps: int, rounds: int,
        device: torch.device, run_seconds: float = 0.0, attention_dropout: float = 0.0,
        model_sizes: dict[str, Any] | None = None,
        on_record: Callable[[list[dict[str, Any]]], None] | None = None,
        compile_mode: str = "default") -> list[dict[str, Any]]:
  """Every (attention, mode) row at every length, shortest first; a row stops at its first
  ``OOM`` (its longer lengths get ``skipped`` records). Arguments as :func:`measure`;
  ``on_record(records so far)`` is called after each cell (progress and partial outputs)."""
  records, stopped = [], set()
  for length in lengths:
    for kind in kinds:
      for mode in modes:
        if (kind, mode) in stopped:
          record = {"label": f"torch_{kind}_{mode}", "attention": kind, "mode": mode,
                    "length": length, "batch": batch, "status": "skipped",
                    "reason": "OOM at a shorter length"}
        else:
          record = measure(kind, mode, length, batch, dtype, steps, rounds, device,
                           run_seconds, attention_dropout, model_sizes, compile_mode)
        if record["status"] == "OOM":
          stopped.add((kind, mode))
        records.append(record)
        if on_record is not None:
          on_record(records)
  return records


def _line(record: dict[str, Any]) -> str:
  if record["status"] != "ok":
    return f"{record['label']:>24} L={record['length']:>6}  {record['status']}: {record['reason']}"
  peak = record.get("peak_bytes")
  memory = f"  {peak / GIB:6.2f} GiB" if peak else ""
  return (f"{record['label']:>24} L={record['length']:>6}  {record['steps_per_sec']:9.3f} steps/s"
          f"{memory}  first step {record['compile_s']:.1f} s")


def jax_rows(payload: dict[str, Any] | None) -> dict[str, dict[int, float]]:
  """``{label: {length: steps/s}}`` of the ``ok`` cells of a ``speed_memory.json`` payload."""
  rows: dict[str, dict[int, float]] = {}
  for record in (payload or {}).get("results", []):
    if record.get("status") == "ok":
      rows.setdefault(record["label"], {})[int(record["length"])] = record["steps_per_sec"]
  return rows


def _fmt(value: float | None) -> str:
  if value is None:
    return ""
  return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def markdown_report(payload: dict[str, Any]) -> str:
  """The tables of a :func:`main` payload: steps/s and peak memory of every PyTorch row, the
  JAX rows of ``--jax_results`` beside them, and each JAX row against the fastest PyTorch
  softmax and against PyTorch ``simple`` at each length."""
  settings, records = payload["settings"], payload["records"]
  lengths = settings["lengths"]
  machine = payload["machine"]
  lines = [f"# PyTorch reference: the benchmark's LRA text model ({settings['dtype']}, batch "
           f"{settings['batch']})", "",
           f"`{payload['command']}`", "",
           f"{machine['device_name']}"
           + (f" (torch threads: {machine['torch_threads']})" if machine["device_type"] == "cpu"
              else "") + f", torch {machine['torch']}"
           + (f", CUDA {machine['cuda']}, cuDNN {machine['cudnn']}" if machine.get("cuda") else "")
           + f"; {payload['created']}. Median of {settings['rounds']} runs of up to "
           f"{settings['steps']} steps"
           + (f" (about {settings['run_seconds']} s each)" if settings["run_seconds"] else "")
           + f"; dropout {settings.get('dropout', MODEL['dropout_rate'])}, softmax attention "
           f"dropout {settings['attention_dropout']}; torch.compile mode "
           f"{settings.get('compile_mode', 'default')}.", ""]
  by_cell = {(r["label"], r["length"]): r for r in records}
  with_memory = any(r.get("peak_bytes") for r in records)
  lines += ["| row | " + " | ".join(f"steps/s {n}" for n in lengths) + " | "
            + "".join(f"peak GiB {n} | " for n in lengths if with_memory),
            "|---|" + "---|" * (len(lengths) * (2 if with_memory else 1))]
  for label in dict.fromkeys(r["label"] for r in records):
    speeds, memories = [], []
    for n in lengths:
      r = by_cell.get((label, n), {"status": ""})
      ok = r["status"] == "ok"
      speeds.append(_fmt(r["steps_per_sec"]) if ok else r["status"])
      memories.append(f"{r['peak_bytes'] / GIB:.2f}" if ok and r.get("peak_bytes") else "")
    lines.append(f"| `{label}` | " + " | ".join(speeds) + " | "
                 + ("".join(f"{m} | " for m in memories) if with_memory else ""))
  jax = jax_rows(payload.get("jax_results"))
  if jax:
    lines += ["", f"JAX rows from `{settings['jax_results']}` (`speed_memory.py`, run just "
              "before on the same machine), steps/s, and each against the fastest PyTorch "
              "softmax row and against the faster PyTorch `simple` row at that length:", "",
              "| JAX row | " + " | ".join(f"steps/s {n}" for n in lengths) + " | "
              + " | ".join(f"vs torch softmax {n}" for n in lengths) + " | "
              + " | ".join(f"vs torch simple {n}" for n in lengths) + " |",
              "|---|" + "---|" * (3 * len(lengths))]
    best = {kind: {n: max((r["steps_per_sec"] for r in records if r["attention"] == kind
                           and r["length"] == n and r["status"] == "ok"), default=None)
                   for n in lengths} for kind in ATTENTIONS}
    for label, speeds in jax.items():
      cells = [_fmt(speeds.get(n)) for n in lengths]
      for kind in ATTENTIONS:
        cells += [f"{speeds[n] / best[kind][n]:.2f}x" if speeds.get(n) and best[kind][n]
                  else "" for n in lengths]
      lines.append(f"| `{label}` | " + " | ".join(cells) + " |")
  failed = [r for r in records if r["status"] not in ("ok", "skipped")]
  if failed:
    lines += ["", "Cells that did not run:", ""]
    lines += [f"- `{r['label']}` at {r['length']}: {r['status']}, {r['reason']}" for r in failed]
  return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None,
         args: argparse.Namespace | None = None) -> dict[str, Any]:
  """Command line: measures every row, writes ``torch_step.json`` and ``torch_step.md``.
  ``args``: the flags already parsed (:func:`parse_args`), as the script's own run passes them;
  else they are parsed from ``argv``.

  Returns:
    The payload written to ``torch_step.json``.

  Raises:
    FileNotFoundError: ``--jax_results`` names a missing file; ValueError: a file that is not
      a ``speed_memory.json``.
    SystemExit: non-zero for ``--device cuda`` without a CUDA device, and when no cell ran
      (ok or OOM), after writing the outputs.
  """
  args = parse_args(argv) if args is None else args
  jax_payload = None
  if args.jax_results:
    if not os.path.exists(args.jax_results):
      raise FileNotFoundError(f"--jax_results {args.jax_results}: no such file")
    with open(args.jax_results) as f:
      jax_payload = json.load(f)
    if not isinstance(jax_payload, dict) or not isinstance(jax_payload.get("results"), list):
      raise ValueError(f"--jax_results {args.jax_results}: not a speed_memory.json (it has no "
                       "'results' list)")
  device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
  if device.type == "cuda" and not torch.cuda.is_available():
    raise SystemExit(f"--device {args.device}: this PyTorch ({torch.__version__}) sees no CUDA "
                     "device")
  start = time.perf_counter()
  payload = {
      "benchmark": "torch_step", "command": " ".join(["python", "benchmarks/torch_step.py",
                                                      *(argv if argv is not None
                                                        else sys.argv[1:])]),
      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "wall_s": 0.0, "machine": machine_info(device),
      "settings": {**{k: v for k, v in vars(args).items() if k != "out"},
                   "lengths": sorted(args.lengths),
                   "model": {**MODEL, "dropout_rate": args.dropout},
                   "learning_rate": LEARNING_RATE, "adam": ADAM},
      "records": [], "jax_results": jax_payload}

  def write(records: list[dict[str, Any]]) -> dict[str, str]:
    """Rewrites both outputs with the cells so far, so a run stopped by a time limit keeps
    what it measured."""
    payload.update(records=records, wall_s=time.perf_counter() - start)
    return speed_memory.write_json_and_text(args.out, "torch_step", payload,
                                            markdown_report(payload))

  def on_record(records: list[dict[str, Any]]) -> None:
    print(_line(records[-1]), flush=True)
    write(records)

  records = run(args.attentions, args.modes, sorted(args.lengths), args.batch, args.dtype,
                args.steps, args.rounds, device, args.run_seconds, args.attention_dropout,
                {"dropout_rate": args.dropout}, on_record=on_record,
                compile_mode=args.compile_mode)
  paths = write(records)
  print(markdown_report(payload))
  print("wrote", ", ".join(paths.values()))
  if not any(r["status"] in ("ok", "OOM") for r in records):
    raise SystemExit("no cell ran; see the reasons in " + paths["md"])
  return payload


if __name__ == "__main__":
  main(args=_ARGS)
