"""Writes a PNG grid of generated Pathfinder images with their labels.

Usage::

  python scripts/pathfinder_grid.py --out docs/pathfinder_samples.png --seed 0

Without ``--out`` it writes ``runs/pathfinder_samples.png``; the committed picture changes only
when named.

The top rows show the first ``--rows x --cols`` images of Pathfinder-32 (``--level``, default
``hard``), the bottom row ``--cols_128`` images of Path-X (128x128, same level): the first ones
of each label, half and half. Every image is scaled up
with nearest-neighbour sampling (32x32 by 8, 128x128 by 2) and captioned with its index and
label (``connected`` = 1, ``apart`` = 0). Image ``i`` is the one that
``simpletron_jax.data.pathfinder.generate_dataset`` writes as image ``i`` for the same seed.
Needs Pillow.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from PIL import Image, ImageDraw

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from simpletron_jax.data import pathfinder  # noqa: E402  pylint: disable=wrong-import-position
from simpletron_jax.runtime import cli  # noqa: E402  pylint: disable=wrong-import-position

_CAPTION = 14  # caption height in pixels
_GAP = 6


def _tile(image_HxW: np.ndarray, scale: int, caption: str) -> Image.Image:
  """One captioned, upscaled image (``[H * scale + caption, W * scale]``)."""
  big = Image.fromarray(image_HxW, mode="L").resize(
      (image_HxW.shape[1] * scale, image_HxW.shape[0] * scale), Image.NEAREST)
  tile = Image.new("L", (big.width, big.height + _CAPTION), 255)
  tile.paste(big, (0, _CAPTION))
  ImageDraw.Draw(tile).text((2, 1), caption, fill=0)
  return tile


def _row(tiles: list[Image.Image]) -> Image.Image:
  row = Image.new("L", (sum(t.width for t in tiles) + _GAP * (len(tiles) - 1),
                        max(t.height for t in tiles)), 255)
  x = 0
  for t in tiles:
    row.paste(t, (x, 0))
    x += t.width + _GAP
  return row


def main(argv: list[str] | None = None) -> str:
  """Renders the grid and returns the path it wrote."""
  parser = cli.ArgumentParser(prog="pathfinder_grid.py", description=__doc__.split("\n")[0])
  parser.add_argument("--out", default=os.path.join("runs", "pathfinder_samples.png"),
                      help="the PNG (default runs/pathfinder_samples.png; the committed one: "
                           "--out docs/pathfinder_samples.png)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--level", default="hard", choices=sorted(pathfinder.LEVELS))
  parser.add_argument("--rows", type=int, default=4)
  parser.add_argument("--cols", type=int, default=4)
  parser.add_argument("--cols_128", type=int, default=4)
  args = parser.parse_args(argv)

  rows = []
  p32 = pathfinder.params_for(32, args.level)
  for r in range(args.rows):
    tiles = []
    for c in range(args.cols):
      i = r * args.cols + c
      image, label = pathfinder.render_example(pathfinder.example_rng(args.seed, p32, i), p32)
      tiles.append(_tile(image, 8, f"32px #{i}: {'connected' if label else 'apart'} ({label})"))
    rows.append(_row(tiles))
  if args.cols_128:
    # The first images of each label, so that both classes show.
    p128 = pathfinder.params_for(128, args.level)
    wanted = {1: (args.cols_128 + 1) // 2, 0: args.cols_128 // 2}
    tiles, i = [], 0
    while len(tiles) < args.cols_128:
      image, label = pathfinder.render_example(pathfinder.example_rng(args.seed, p128, i), p128)
      if wanted[label]:
        wanted[label] -= 1
        tiles.append(_tile(image, 2,
                           f"Path-X #{i}: {'connected' if label else 'apart'} ({label})"))
      i += 1
    rows.append(_row(tiles))
  grid = Image.new("L", (max(r.width for r in rows),
                         sum(r.height for r in rows) + _GAP * (len(rows) - 1)), 255)
  y = 0
  for r in rows:
    grid.paste(r, (0, y))
    y += r.height + _GAP
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  grid.save(args.out)
  print(f"wrote {args.out} ({grid.width}x{grid.height})")
  return args.out


if __name__ == "__main__":
  main()
