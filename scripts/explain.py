"""Shows what a trained model looks at: attention maps and token relevance (issue 33).

Usage::

    python scripts/explain.py --workdir RUN [--split test] [--index N | --count K] [--out DIR]

Loads the run's best-validation checkpoint (``--which latest`` or ``--step S`` for another)
and its ``config.json``, and for each chosen example of ``--split`` (``--index N``: example
N; ``--count K``: examples 0..K-1, or N..N+K-1 with both) writes into ``--out`` (default
``RUN/explain``) ``<task>_<attention>_<split>_<index>.png`` and ``.json``:

* per encoder layer and head, the token-to-token map: the softmax weights (``softmax``), the
  exact implicit map ``A`` with ``y = A V`` (``simple``, ``simple_res``, ``simple_resl``,
  ``linear``, ``performer``), or the value Jacobian for the other variants
  (``simpletron_jax/tools/explain.py`` says what each is and when it is exact); drawn over the real
  positions (CLS first under CLS pooling), signed maps in red and blue;
* the relevance of each input token to the predicted class: gradient x input of its logit
  with respect to the token embedding (Shrikumar et al., 2016), for every variant alike;
* drawn in the task's terms: ListOps as the expression with its tokens shaded, text as the
  review's characters shaded, image and Pathfinder as a heat map beside the input picture,
  retrieval as both documents.

The JSON holds the prediction, the relevance of every token, and per layer and head the
map's pooled row (the CLS query's row, or under MEAN pooling the mean of the real rows: the
weight with which the pooled encoding takes each position's value in that layer) and its
summary; ``--save_maps`` also writes the full maps as ``.npz``. Everything is computed in
float32 whatever the run's ``model.dtype``. Needs matplotlib (``pip install -e ".[bench]"``).
Details and the committed pictures: ``docs/explain.md``.

A user error (a workdir without a checkpoint or config, an index outside the split) ends
with one line, ``explain.py: <cause>``, and exit status 1 (``--verbose``: the traceback).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from simpletron_jax.runtime import cli  # noqa: E402  pylint: disable=wrong-import-position

from simpletron_jax.data import tasks as task_registry  # noqa: E402  pylint: disable=C0413

if TYPE_CHECKING:   # the functions import it (it imports JAX): --help ends before JAX loads
  from simpletron_jax.tools import explain

IMAGE_TASKS = task_registry.shown_as("pixels")   # drawn as an image (TaskSpec.shown)
TEXT_TASKS = task_registry.shown_as("bytes")     # bytes run on; other tasks' tokens are spaced
CHARS_PER_LINE = 100
DPI = 80
DPI_SHORT = 110   # when every position is named on the maps' axes
MAX_LABELLED = 80   # positions named on a map's axes up to this many


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """The command line (module docstring).

  Raises:
    SystemExit: a bad invocation (a missing or unknown flag, a bad value): one line,
      ``explain.py: <cause> (see --help)``, status 1
      (:meth:`simpletron_jax.runtime.cli.ArgumentParser.error`).
  """
  parser = cli.ArgumentParser(prog="explain.py", description=__doc__.split("\n\n")[0])
  parser.add_argument("--workdir", required=True, help="a train.py run directory")
  parser.add_argument("--split", default="test", choices=("train", "val", "test"))
  parser.add_argument("--index", type=int, default=None, help="the (first) example's index")
  parser.add_argument("--count", type=int, default=None, help="how many examples")
  parser.add_argument("--which", default="best", choices=("best", "latest"),
                      help="the best-validation or the newest checkpoint")
  parser.add_argument("--step", type=int, default=None,
                      help="restore this step from RUN/checkpoints instead")
  parser.add_argument("--target", type=int, default=None,
                      help="explain this class's logit (default: the predicted class)")
  parser.add_argument("--out", default=None, help="output folder (default RUN/explain)")
  parser.add_argument("--save_maps", action="store_true",
                      help="also write the full maps of each example as .npz")
  parser.add_argument("--verbose", action="store_true",
                      help="show the traceback of every error, user errors included")
  return parser.parse_args(argv)


def example_indices(index: int | None, count: int | None, size: int) -> list[int]:
  """The examples chosen by ``--index`` and ``--count`` in a split of ``size``.

  Returns:
    ``[index]``; ``range(count)``; ``range(index, index + count)``; ``[0]`` with neither.

  Raises:
    ValueError: naming ``--index`` or ``--count`` when outside the split or not positive.
  """
  start = 0 if index is None else index
  n = 1 if count is None else count
  if n < 1:
    raise ValueError(f"--count {count} must be at least 1")
  if not 0 <= start or start + n > size:
    raise ValueError(f"--index {start} and --count {n} reach past the split's {size} examples "
                     f"(indices 0..{size - 1})")
  return list(range(start, start + n))


# ----------------------------------------------------------------------------
# Loading a run.


def load_run(workdir: str, which: str = "best", step: int | None = None):
  """The run's config, data, float32 model, apply function, parameters and restored step.

  The run is restored as eval.py restores it (``saved_runs.load_run``: the saved config,
  the task's data, the best-validation, newest or ``step`` checkpoint checked against them).

  Returns:
    ``(config, data, model, apply_fn, params, step)``; ``model`` and ``apply_fn`` compute in
    float32 (:func:`simpletron_jax.tools.explain.float32_model_config`) and merge LoRA weights.

  Raises:
    FileNotFoundError, errors.ConfigMismatchError, errors.CheckpointError: see
      ``saved_runs.load_run``, ``SavedRun.restore``.
  """
  # pylint: disable=import-outside-toplevel  (the training modules load only for a run)
  from simpletron_jax.data.common import PairedExamples
  from simpletron_jax.model import encoders, lora
  from simpletron_jax.tools import explain
  from simpletron_jax.train import saved_runs

  saved = saved_runs.load_run(workdir, which, step)
  config, _, data, state = saved.restore()
  restored = saved.step
  model32 = encoders.build_classifier(explain.float32_model_config(config.model),
                                      vocab_size=data.vocab_size, num_classes=data.num_classes,
                                      dual=isinstance(data.train, PairedExamples))
  apply_fn = model32.apply
  rank = config.get("lora", {}).get("rank", 0)
  if rank > 0:
    apply_fn = lora.wrap_apply(model32.apply, lora.scale_of(rank, config.lora.alpha))
  return config, data, model32, apply_fn, state.params, restored


def example_batch(split, index: int, config) -> dict[str, np.ndarray]:
  """Example ``index`` of ``split`` as a batch of one, truncated and padded as the run's
  evaluation pads it (``model.max_length``, ``data.bucket``)."""
  from simpletron_jax.data.common import make_batch  # pylint: disable=import-outside-toplevel
  return make_batch(split, np.array([index]), max_length=int(config.model.max_length),
                    bucket=int(config.data.get("bucket", 0)))


# ----------------------------------------------------------------------------
# The task's own terms.


def task_vocabulary(config) -> list[str] | None:
  """The strings of a WordPiece task's token ids (AG News: ``data.vocab_path``'s
  ``vocab.txt``, one token a line), or None (the other tasks, or no readable file)."""
  path = config.data.get("vocab_path") if config.task == "agnews" else None
  if not path:
    return None
  try:
    from simpletron_jax.data import agnews  # pylint: disable=import-outside-toplevel
    with open(agnews.vocab_file(path), encoding="utf-8") as f:
      return [line.rstrip("\n") for line in f]
  except (OSError, ValueError):
    return None


def token_strings(task: str, ids: np.ndarray, vocab: Sequence[str] | None = None) -> list[str]:
  """Display strings of input token ids: ``vocab[id]`` when given (WordPiece), ListOps's
  tokens, text bytes as characters (``?`` for a byte outside printable ASCII), else the ids
  (pixel values) as numbers."""
  if vocab is not None:
    return [vocab[int(t)] if int(t) < len(vocab) else str(int(t)) for t in ids]
  if task == "listops":
    from simpletron_jax.data.listops import VOCAB  # pylint: disable=import-outside-toplevel
    return [VOCAB[int(t)] for t in ids]
  if task in TEXT_TASKS:
    return [chr(int(t) - 1) if 32 <= int(t) - 1 < 127 else "?" for t in ids]
  return [str(int(t)) for t in ids]


def _real(batch: dict[str, np.ndarray], document: int) -> np.ndarray:
  """The real token ids of document ``document`` of a batch of one."""
  suffix = "" if document == 0 else "2"
  return batch[f"inputs{suffix}"][0][batch[f"mask{suffix}"][0]]


def _pooled_row(weights_HxNxL: np.ndarray, offset: int, n: int) -> np.ndarray:
  """``[H, n]``: the CLS query's row (``offset == 1``), else the mean of the real rows, over
  the real positions ``0..n-1`` of the block's sequence."""
  if offset:
    return weights_HxNxL[:, 0, :n]
  return weights_HxNxL[:, :n, :n].mean(axis=1)


def _round(values, digits: int = 4) -> list[float]:
  return [float(f"{float(v):.{digits}g}") for v in np.asarray(values).reshape(-1)]


def record(ex: explain.Explanation, batch, task: str, meta: dict[str, Any],
           vocab: Sequence[str] | None = None) -> dict[str, Any]:
  """The JSON record of one example (module docstring); ``vocab`` as in
  :func:`token_strings`."""
  from simpletron_jax.tools import explain  # pylint: disable=import-outside-toplevel
  probs = np.exp(ex.logits - ex.logits.max())
  probs = probs / probs.sum()
  docs = []
  for d, rel in enumerate(ex.relevance):
    ids = _real(batch, d)
    mask = batch["mask" if d == 0 else "mask2"][0]
    entry = {"length": int(len(ids)), "relevance": _round(rel[mask])}
    entry["tokens" if task not in IMAGE_TASKS else "pixels"] = (
        token_strings(task, ids, vocab) if task not in IMAGE_TASKS else [int(t) for t in ids])
    docs.append(entry)
  maps = []
  for m in ex.maps:
    n = ex.offset + len(_real(batch, m.document))
    pooled = _pooled_row(m.weights, ex.offset, n)
    real = m.weights[:, :n, :n] if m.weights.shape[1] > 1 else m.weights[:, :, :n]
    maps.append({
        "layer": m.block, "document": m.document, "attention": m.attention,
        "method": m.method, "method_description": explain.METHODS[m.method],
        "shape_over_real_positions": list(real.shape[1:]),
        "pooled_row_is": "CLS query" if ex.offset else "mean of the real query rows",
        "heads": [{"head": h, "max_abs": _round([np.abs(real[h]).max()])[0],
                   "mean_row_sum": _round([real[h].sum(-1).mean()])[0],
                   "signed": bool((real[h] < 0).any()), "pooled_row": _round(pooled[h])}
                  for h in range(real.shape[0])]})
  return {**meta, "predicted": ex.predicted, "target": ex.target,
          "probabilities": _round(probs),
          "positions": ("position 0 is the CLS token, position p > 0 the input token p - 1"
                        if ex.offset else "position p is the input token p"),
          "relevance": {"method": explain.RELEVANCE_METHOD,
                        "of": f"the logit of class {ex.target}",
                        "citation": explain.RELEVANCE_CITATION, "documents": docs},
          "maps": maps}


# ----------------------------------------------------------------------------
# Drawing.


def _sym_limit(values) -> float:
  v = float(np.abs(np.asarray(values)).max()) if np.size(values) else 0.0
  return v if v > 0 else 1.0


def _token_layout(tokens: Sequence[str], sep: bool, width: int) -> list[tuple[int, int, int]]:
  """``(x, line, width)`` in characters of each token, wrapped at ``width`` characters."""
  x, line, out = 0, 0, []
  for tok in tokens:
    w = max(len(tok), 1)
    if x and x + w > width:
      x, line = 0, line + 1
    out.append((x, line, w))
    x += w + int(sep)
  return out


def draw_tokens(ax, tokens: Sequence[str], values: np.ndarray, title: str, sep: bool,
                width: int = CHARS_PER_LINE) -> None:
  """Tokens in lines of ``width`` monospace characters, each on a cell shaded by its value
  (``RdBu_r``, symmetric about 0: red pushes towards the class, blue away)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  from matplotlib.patches import Rectangle  # pylint: disable=import-outside-toplevel
  cmap = matplotlib.colormaps["RdBu_r"]
  limit = _sym_limit(values)
  layout = _token_layout(tokens, sep, width)
  lines = (layout[-1][1] + 1) if layout else 1
  ax.set_xlim(0, width)
  ax.set_ylim(lines, 0)
  ax.set_axis_off()
  ax.set_title(title, fontsize=9, loc="left")
  box = ax.get_position()
  char_pt = box.width * ax.figure.get_figwidth() * 72 / width   # a character's width, points
  for (x, line, w), tok, val in zip(layout, tokens, values):
    ax.add_patch(Rectangle((x, line + 0.06), w, 0.88, linewidth=0,
                           facecolor=cmap(0.5 + 0.5 * float(val) / limit)))
    ax.text(x + w / 2, line + 0.5, tok, ha="center", va="center", family="monospace",
            fontsize=char_pt / 0.62)


def _lines_needed(tokens: Sequence[str], sep: bool) -> int:
  layout = _token_layout(tokens, sep, CHARS_PER_LINE)
  return (layout[-1][1] + 1) if layout else 1


def draw(ex: explain.Explanation, batch, task: str, meta: dict[str, Any], path: str,
         vocab: Sequence[str] | None = None) -> None:
  """Writes the example's figure to ``path`` (PNG): the task view on top (shaded tokens, or
  the picture beside the relevance heat map), and one panel per layer, document and head
  with the map over the real positions (and, for pictures, the pooled row as a heat map).

  Raises:
    ImportError: matplotlib is missing (``pip install -e ".[bench]"``).
  """
  from simpletron_jax.tools import explain  # pylint: disable=import-outside-toplevel
  try:
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError("scripts/explain.py draws with matplotlib: pip install -e '.[bench]'") from e
  image = task in IMAGE_TASKS
  docs = len(ex.relevance)
  heads = ex.maps[0].weights.shape[0]
  width = 12.0
  if image:
    top_heights = [2.5]
  else:
    sep = task not in TEXT_TASKS   # bytes run on; tokens are spaced
    top_heights = [0.3 + 0.24 * _lines_needed(token_strings(task, _real(batch, d), vocab), sep)
                   for d in range(docs)]
  blocks = sorted({m.block for m in ex.maps})
  map_rows = len(blocks)
  per_map = 3.0 if image else 2.8
  per_doc = heads * (2 if image else 1)   # columns of one document in a layer's row
  cols = per_doc * docs
  heights = top_heights + [per_map] * map_rows
  total = sum(heights) + 1.2
  longest = max(m.weights.shape[-1] for m in ex.maps)
  dpi = DPI_SHORT if longest <= MAX_LABELLED else DPI
  fig = plt.figure(figsize=(width, total), dpi=dpi)
  grid = fig.add_gridspec(len(heights), 1, height_ratios=heights, hspace=0.45,
                          top=1 - 0.55 / total, bottom=0.6 / total, left=0.05, right=0.97)
  truth = meta.get("label")
  fig.suptitle(f"{task}, {meta['attention']} ({meta['split']} example {meta['index']}): label "
               f"{truth}, predicted {ex.predicted}; relevance = {explain.RELEVANCE_METHOD} of "
               f"logit {ex.target}", fontsize=10)
  if image:
    _draw_picture(fig, grid[0], batch, ex)
  else:
    for d in range(docs):
      ax = fig.add_subplot(grid[d])
      mask = batch["mask" if d == 0 else "mask2"][0]
      label = "" if docs == 1 else f"document {d + 1}: "
      draw_tokens(ax, token_strings(task, _real(batch, d), vocab), ex.relevance[d][mask],
                  f"{label}tokens shaded by relevance (red: towards class {ex.target}, "
                  "blue: away)", sep=task not in TEXT_TASKS)
  rows = {b: grid[len(top_heights) + r].subgridspec(1, cols, wspace=0.35)
          for r, b in enumerate(blocks)}
  for m in ex.maps:
    sub = rows[m.block]
    n = ex.offset + len(_real(batch, m.document))
    real = m.weights[:, :n, :n] if m.weights.shape[1] > 1 else m.weights[:, :, :n]
    for h in range(heads):
      ax = fig.add_subplot(sub[0, m.document * per_doc + h * (2 if image else 1)])
      _draw_map(fig, ax, real[h], f"layer {m.block}{_doc(m, docs)} head {h}: {m.attention}, "
                f"{m.method.replace('_', ' ')}",
                ["CLS"] * ex.offset + token_strings(task, _real(batch, m.document), vocab))
      if image:
        ax = fig.add_subplot(sub[0, 2 * h + 1])
        pooled = _pooled_row(m.weights, ex.offset, n)[h][ex.offset:]
        _draw_grid(fig, ax, pooled, f"layer {m.block} head {h}: "
                   f"{'CLS row' if ex.offset else 'mean row'} (pixels)", signed=None)
  save_png(fig, path, dpi)
  plt.close(fig)


def save_png(fig, path: str, dpi: int = DPI) -> None:
  """Saves ``fig`` as a PNG with a 256-colour adaptive palette (Pillow, which matplotlib
  needs anyway): maps of a thousand positions then stay under about 300 KB."""
  import io  # pylint: disable=import-outside-toplevel
  from PIL import Image  # pylint: disable=import-outside-toplevel
  buffer = io.BytesIO()
  fig.savefig(buffer, dpi=dpi, format="png")
  buffer.seek(0)
  with Image.open(buffer) as image:
    image.convert("RGB").quantize(256).save(path, optimize=True)


def _doc(m: explain.LayerMap, docs: int) -> str:
  return f", doc {m.document + 1}" if docs > 1 else ""


def _draw_map(fig, ax, a_NxL: np.ndarray, title: str,
              labels: Sequence[str] | None = None) -> None:
  """One map: rows queries, columns keys; signed maps diverging about 0. ``labels`` (one per
  key position) name the positions on both axes when there are at most
  :data:`MAX_LABELLED` of them."""
  signed = bool((a_NxL < 0).any())
  if signed:
    limit = _sym_limit(a_NxL)
    im = ax.imshow(a_NxL, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto",
                   interpolation="nearest")
  else:
    im = ax.imshow(a_NxL, cmap="viridis", vmin=0, aspect="auto", interpolation="nearest")
  ax.set_title(title, fontsize=8)
  ax.set_xlabel("key position", fontsize=7)
  ax.set_ylabel("query position", fontsize=7)
  ax.tick_params(labelsize=6)
  if labels is not None and len(labels) <= MAX_LABELLED:
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=5, family="monospace")
    if a_NxL.shape[0] == len(labels):
      ax.set_yticks(range(len(labels)), labels, fontsize=5, family="monospace")
  fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02).ax.tick_params(labelsize=6)


def _draw_grid(fig, ax, values: np.ndarray, title: str, signed: bool | None) -> None:
  """Per-pixel values as a square heat map."""
  side = int(round(math.sqrt(values.size)))
  grid = np.full(side * side, np.nan)
  grid[:min(values.size, side * side)] = values[:side * side]
  grid = grid.reshape(side, side)
  if signed is None:
    signed = bool((values < 0).any())
  if signed:
    limit = _sym_limit(values)
    im = ax.imshow(grid, cmap="RdBu_r", vmin=-limit, vmax=limit, interpolation="nearest")
  else:
    im = ax.imshow(grid, cmap="viridis", interpolation="nearest")
  ax.set_title(title, fontsize=8)
  ax.set_axis_off()
  fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02).ax.tick_params(labelsize=6)


def _draw_picture(fig, spec, batch, ex: explain.Explanation) -> None:
  """The input picture beside its relevance heat map."""
  sub = spec.subgridspec(1, 4, wspace=0.3)
  pixels = _real(batch, 0).astype(float)
  side = int(round(math.sqrt(pixels.size)))
  ax = fig.add_subplot(sub[0, 0])
  ax.imshow(pixels[:side * side].reshape(side, side), cmap="gray", vmin=0, vmax=255,
            interpolation="nearest")
  ax.set_title("input", fontsize=8)
  ax.set_axis_off()
  mask = batch["mask"][0]
  _draw_grid(fig, fig.add_subplot(sub[0, 1]), ex.relevance[0][mask],
             f"relevance (red: towards class {ex.target})", signed=True)


# ----------------------------------------------------------------------------


def explain_examples(args: argparse.Namespace) -> list[str]:
  """Runs the command; returns the files written.

  Raises:
    FileNotFoundError, ValueError: user errors (see the module docstring).
  """
  from simpletron_jax.tools import explain  # pylint: disable=import-outside-toplevel
  config, data, model, apply_fn, params, step = load_run(args.workdir, args.which, args.step)
  split = getattr(data, args.split)
  indices = example_indices(args.index, args.count, len(split))
  out_dir = args.out or os.path.join(args.workdir, "explain")
  os.makedirs(out_dir, exist_ok=True)
  task, attention = config.task, config.model.attention
  vocab = task_vocabulary(config)
  written = []
  for i in indices:
    batch = example_batch(split, i, config)
    ex = explain.explain(model, apply_fn, params, batch, args.target)
    stem = os.path.join(out_dir, f"{task}_{attention}_{args.split}_{i}")
    meta = {"workdir": args.workdir, "checkpoint_step": int(step), "task": task,
            "attention": attention, "split": args.split, "index": i,
            "label": int(split.labels[i]), "png": os.path.basename(stem) + ".png"}
    rec = record(ex, batch, task, meta, vocab)
    with open(stem + ".json", "w", encoding="utf-8") as f:
      json.dump(rec, f, indent=1)
    draw(ex, batch, task, meta, stem + ".png", vocab)
    written += [stem + ".json", stem + ".png"]
    if args.save_maps:
      np.savez_compressed(stem + ".npz", **{f"layer{m.block}_doc{m.document}": m.weights
                                            for m in ex.maps},
                          **{f"relevance_doc{d}": r for d, r in enumerate(ex.relevance)})
      written.append(stem + ".npz")
    print(f"example {i}: label {rec['label']}, predicted {ex.predicted}; wrote {stem}.png "
          "and .json", flush=True)
  return written


def main(argv: Sequence[str] | None = None) -> int:
  """Entry point; returns 0.

  Raises:
    SystemExit: ``explain.py: <cause>`` (status 1) when matplotlib cannot be imported, and
      for a user error
      (:func:`simpletron_jax.runtime.cli.user_errors_exit`: a missing file, a bad value, a damaged
      or mismatched checkpoint), unless ``--verbose``.
  """
  args = parse_args(argv)
  try:   # every example is drawn: without matplotlib, one line before any work
    import matplotlib  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError as e:
    if args.verbose:
      raise
    raise SystemExit("explain.py: matplotlib cannot be imported, and it draws every figure: "
                     f"pip install -e \".[bench]\" ({e})") from None
  with cli.user_errors_exit("explain.py", args.verbose, dirs=(ROOT,)):
    explain_examples(args)
  return 0


if __name__ == "__main__":
  sys.exit(main())
