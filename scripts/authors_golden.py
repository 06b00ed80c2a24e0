"""Golden numbers from the SimpleTRON authors' own PyTorch code, for
``tests/test_authors_golden.py``.

The authors' model and schedule are defined in notebook cells of
``vladyorsh/lra_efficient_transformers``: ``lra/notebooks/listops_setup_simple_2.ipynb``
(ListOps: ``TEmbedding``, ``SimpleAttention``, ``TBlock``, ``TClassifier``, ``Transformer``)
and ``lra/notebooks/bpe_matching_setup_simple_2.ipynb`` (matching: the same blocks with
``DualClassifier``), each with an optimizer cell (``get_schedule``, ``lr``, ``weight_decay``,
``warmup``, ``optim.AdamW``). This script reads those notebooks from a checkout at run time,
executes only their definitions (imports, classes, functions and constant assignments of the
model cell and of the optimizer cell; never the data download, ``model_factory`` (it calls
``.cuda()``), ``training_setup`` or the training cells) and writes numbers only: nothing of
the authors' code is copied into this project, and the tests need no torch.

Recipe (CPU, PyTorch >= 1.9, a few seconds)::

    python scripts/authors_golden.py --authors_src /tmp/authors --out tests/fixtures/authors

Per case (``simple__listops``, ``simple__retrieval``) it builds the authors' ``Transformer``
at a tiny size (emb = qkv 32, 2 heads, mlp 64, 2 blocks, max_length 40; ListOps vocab 20 and
10 classes, matching vocab 30 and 2 classes), replaces every block's attention by
``SimpleAttention(emb, emb, heads, dropout)`` as the notebooks' ``model_factory`` does, with
every dropout rate 0, seeded ``torch.manual_seed(0)``. It writes ``<out>/<case>.npz``:

* ``param/<state_dict name>``: the authors' initialised weights, float32, torch layouts
  (``nn.Linear`` weight ``[out, in]``);
* ``inputs`` ``[B, max_length]`` int32 (``inputs2`` for matching): token ids ``1..vocab-1``
  followed by 0s, padded to ``max_length`` as the authors' input pipeline padded every batch;
* ``logits`` ``[B, C]`` float32: ``model(inputs)`` in eval mode;
* ``train_inputs`` ``[3, B, max_length]`` (``train_inputs2``), ``train_targets`` ``[3, B]``:
  one batch per step; ``train_losses`` ``[3]``: the loss of each of 3 steps of the notebook's
  loop (``zero_grad``, ``criterion(outputs + 1e-5, labels)`` with ``nn.CrossEntropyLoss``,
  ``backward``, ``optimizer.step``, ``scheduler.step``; one micro-batch per step) with the
  notebook's ``optim.AdamW(lr, weight_decay)`` and ``LambdaLR(get_schedule(warmup))``;
  ``train_losses_warm2`` ``[3]``: the same from the initial weights with the notebook's
  ``get_schedule(2)``, so that the second and third steps move the weights visibly (with the
  notebook's warmup of 1000 or 8000 steps the learning rate of steps 0..2 is 0, 1.6e-7 and
  3.2e-7 on ListOps);
* ``hparams``: a JSON string with the sizes, the notebook's ``lr``, ``weight_decay``,
  ``warmup``, AdamW's ``betas`` and ``eps`` (torch's defaults, read from the optimizer) and
  the notebook files read.

Raises:
  SystemExit: if a notebook or one of the needed definitions is missing.
"""

from __future__ import annotations

import ast
import json
import math
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:   # appended: nothing here may shadow the authors' modules
  sys.path.append(ROOT)
from simpletron_jax.runtime import cli  # noqa: E402  pylint: disable=wrong-import-position

NOTEBOOKS = {"listops": "lra/notebooks/listops_setup_simple_2.ipynb",
             "retrieval": "lra/notebooks/bpe_matching_setup_simple_2.ipynb"}
SIZES = {"emb_dim": 32, "num_heads": 2, "mlp_dim": 64, "num_layers": 2, "max_length": 40}
TASKS = {"listops": {"vocab": 20, "classes": 10, "batch": 4},
         "retrieval": {"vocab": 30, "classes": 2, "batch": 3}}
LOGIT_EPS = 1e-5   # the notebooks' train_model(eps=1e-5): criterion(outputs + eps, labels)
TRAIN_STEPS = 3


def _definitions(source: str) -> str:
  """The imports, class and function definitions and constant assignments of a cell;
  IPython lines (``!``, ``%``) and every other statement are dropped."""
  lines = [ln for ln in source.splitlines() if not ln.lstrip().startswith(("!", "%"))]
  tree = ast.parse("\n".join(lines))
  keep = []
  for node in tree.body:
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.ClassDef, ast.FunctionDef)):
      keep.append(node)
    elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
          and all(isinstance(t, ast.Name) for t in node.targets)):
      keep.append(node)
  return ast.unparse(ast.Module(body=keep, type_ignores=[]))


def load_notebook(path: str) -> dict:
  """Executes the model cell (the one defining ``class SimpleAttention`` and
  ``class Transformer``) and the optimizer cell (``def get_schedule``) of one notebook.

  Returns:
    The namespace: ``Transformer``, ``SimpleAttention``, ``get_schedule``, ``lr``,
    ``weight_decay``, ``warmup``, ``torch``, ``nn``, ``np`` ...

  Raises:
    SystemExit: if either cell is missing.
  """
  import torch  # pylint: disable=import-outside-toplevel
  with open(path) as f:
    cells = [''.join(c["source"]) for c in json.load(f)["cells"] if c["cell_type"] == "code"]
  namespace = {"torch": torch, "np": np, "math": math, "__name__": "authors_notebook"}
  wanted = (("class SimpleAttention", "class Transformer"), ("def get_schedule",))
  for needles in wanted:
    found = [c for c in cells if all(n in c for n in needles)]
    if not found:
      raise SystemExit(f"{path}: no cell defines {needles}")
    exec(compile(_definitions(found[0]), path, "exec"), namespace)  # pylint: disable=exec-used
  for name in ("Transformer", "SimpleAttention", "get_schedule", "lr", "weight_decay",
               "warmup"):
    if name not in namespace:
      raise SystemExit(f"{path}: {name} is not defined by the model or optimizer cell")
  return namespace


def build_model(ns: dict, task: str):
  """The notebook's ``model_factory`` at :data:`SIZES` on CPU, every dropout rate 0."""
  spec, s = TASKS[task], SIZES
  common = dict(classes=spec["classes"], num_embeddings=spec["vocab"], seq_len=s["max_length"],
                hidden_dim=s["emb_dim"], qkv_dim=s["emb_dim"], mlp_dim=s["mlp_dim"],
                num_heads=s["num_heads"], num_blocks=s["num_layers"],
                internal_dropout_rate=0.0)
  if task == "listops":   # the ListOps notebook passes output_mlp_units = mlp_dim (2048)
    common.update(output_mlp_units=s["mlp_dim"], output_dropout_rate=0.0)
  model = ns["Transformer"](**common)
  for block in model.blocks:
    block.attention = ns["SimpleAttention"](s["emb_dim"], s["emb_dim"], s["num_heads"], 0.0)
  return model


def _batch(rng: np.random.Generator, batch: int, vocab: int, max_length: int) -> np.ndarray:
  """Token ids ``1..vocab-1`` of random lengths (one full row), padded with 0."""
  lengths = [max_length] + list(rng.integers(3, max_length, size=batch - 1))
  out = np.zeros((batch, max_length), np.int32)
  for i, n in enumerate(lengths):
    out[i, :n] = rng.integers(1, vocab, size=n)
  return out


def _forward(model, task, x1, x2):
  import torch  # pylint: disable=import-outside-toplevel
  t1 = torch.as_tensor(x1, dtype=torch.int64)
  if task == "retrieval":
    return model((t1, torch.as_tensor(x2, dtype=torch.int64)))[0]
  return model(t1)[0]


def _train(ns, model, task, xs1, xs2, ys, warmup) -> list[float]:
  """The notebook's training loop for ``len(ys)`` steps of one micro-batch each."""
  import torch  # pylint: disable=import-outside-toplevel
  from torch.optim.lr_scheduler import LambdaLR  # pylint: disable=import-outside-toplevel
  optimizer = torch.optim.AdamW(model.parameters(), lr=ns["lr"], weight_decay=ns["weight_decay"])
  scheduler = LambdaLR(optimizer, ns["get_schedule"](warmup))
  criterion = torch.nn.CrossEntropyLoss()
  model.train()
  losses = []
  for step in range(len(ys)):
    optimizer.zero_grad()
    outputs = _forward(model, task, xs1[step], None if xs2 is None else xs2[step])
    loss = criterion(outputs + LOGIT_EPS, torch.as_tensor(ys[step], dtype=torch.int64))
    loss.backward()
    losses.append(loss.item())
    optimizer.step()
    scheduler.step()
  return losses, optimizer.defaults


def make_case(ns: dict, task: str, notebook: str) -> dict[str, np.ndarray]:
  """The fixture arrays of one task (see the module docstring)."""
  import torch  # pylint: disable=import-outside-toplevel
  torch.manual_seed(0)
  rng = np.random.default_rng(0)
  spec, length = TASKS[task], SIZES["max_length"]
  model = build_model(ns, task)
  state = {k: v.detach().numpy().astype(np.float32).copy() for k, v in model.state_dict().items()}
  dual = task == "retrieval"
  x1 = _batch(rng, spec["batch"], spec["vocab"], length)
  x2 = _batch(rng, spec["batch"], spec["vocab"], length) if dual else None
  model.eval()
  with torch.no_grad():
    logits = _forward(model, task, x1, x2).numpy().astype(np.float32)
  xs1 = np.stack([_batch(rng, spec["batch"], spec["vocab"], length) for _ in range(TRAIN_STEPS)])
  xs2 = (np.stack([_batch(rng, spec["batch"], spec["vocab"], length)
                   for _ in range(TRAIN_STEPS)]) if dual else None)
  ys = rng.integers(0, spec["classes"], size=(TRAIN_STEPS, spec["batch"])).astype(np.int32)
  losses, defaults = _train(ns, model, task, xs1, xs2, ys, ns["warmup"])
  model.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
  losses2, _ = _train(ns, model, task, xs1, xs2, ys, 2)
  hparams = {**SIZES, **{k: spec[k] for k in ("vocab", "classes")}, "notebook": notebook,
             "lr": float(ns["lr"]), "weight_decay": float(ns["weight_decay"]),
             "warmup": int(ns["warmup"]), "warmup2": 2,
             "betas": [float(b) for b in defaults["betas"]], "eps": float(defaults["eps"]),
             "logit_eps": LOGIT_EPS, "torch": torch.__version__}
  out = {f"param/{k}": v for k, v in state.items()}
  out.update(inputs=x1, logits=logits, train_inputs=xs1, train_targets=ys,
             train_losses=np.asarray(losses, np.float64),
             train_losses_warm2=np.asarray(losses2, np.float64),
             hparams=np.asarray(json.dumps(hparams)))
  if dual:
    out.update(inputs2=x2, train_inputs2=xs2)
  return out


def main(argv=None) -> int:
  parser = cli.ArgumentParser(prog="authors_golden.py", description=__doc__.splitlines()[0])
  parser.add_argument("--authors_src", required=True,
                      help="a checkout of vladyorsh/lra_efficient_transformers")
  parser.add_argument("--out", required=True, help="folder for the .npz fixtures")
  args = parser.parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  for task, notebook in NOTEBOOKS.items():
    path = os.path.join(args.authors_src, notebook)
    if not os.path.exists(path):
      raise SystemExit(f"{path} not found (--authors_src)")
    arrays = make_case(load_notebook(path), task, notebook)
    target = os.path.join(args.out, f"simple__{task}.npz")
    np.savez(target, **arrays)
    print(f"{target}: logits {arrays['logits'].shape}, losses {arrays['train_losses']}, "
          f"warmup-2 losses {arrays['train_losses_warm2']}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
