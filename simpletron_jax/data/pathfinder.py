"""Pathfinder: a seeded image generator and the reader for LRA's Pathfinder files.

The task is from Linsley et al. (2018), "Learning long-range spatial dependencies with
horizontal gated recurrent units". LRA (Tay et al., 2020) uses it at 32x32 ("Pathfinder")
and at 128x128 ("Path-X"). An image shows a few curved paths on a black background, and two
round markers. The label is 1 when one path joins the two markers, and 0 when the markers sit
on two different paths.

Generator (:func:`render_example`)
  A path is a chain of ``paddles``: straight strokes of ``paddle_length`` pixels and
  ``paddle_thickness`` pixels width. Each paddle turns from the previous one by a whole number
  of degrees drawn uniformly from ``[-max_turn_deg, max_turn_deg]``; path vertices lie on a
  1/8-pixel lattice. An image has two long paths of ``contour_length`` paddles, and
  ``num_distractors`` short paths of ``distractor_length`` paddles, each drawn as a random walk
  (with backtracking when it gets stuck) from a uniform start. Every stroke and marker has the
  same intensity, ``contrast`` (times 255).

  The label is a coin flip, drawn first. In a positive image both markers sit on the two ends
  of long path 0. In a negative image one marker sits on an end of long path 0 and the other on
  an end of long path 1. Everything else is drawn in the same way for both labels, so both
  classes have the same number of paths, of the same lengths. In fact the whole scene is drawn
  without looking at the label; only the choice of marker ends depends on it. Path 1 is drawn
  so that one of its ends lies about as far from an end of path 0 as path 0's two ends lie
  from each other (within ``marker_distance_tolerance``), and a negative's markers go on such
  a pair, so the distance between the markers has nearly the same distribution in both
  classes. A marker zone (the disc) is reserved at both ends of both long paths before any
  later path is drawn, marker or not, so no other path ever touches a marker. Both long paths
  have their ends at least ``seed_distance`` apart, and so are the two markers.

  This generator was written from the paper's description and LRA's parameter list for the
  original (``drewlinsley/pathfinder``, listed in ``lra_benchmarks/data/pathfinder.py``), not
  from the original code. Two choices make the label checkable on the pixels:

  * The paddles of a path join end to end, so each path is one 8-connected set of lit pixels
    (the paper's figures show paths of separate paddles with small gaps). ``paddle_margin`` is
    the clearance between different paths: at least ``margin`` dark pixels lie between a pixel
    of one path and a pixel of any other path (in the 8-neighbourhood sense). It also applies
    within one path, to parts more than two paddles apart.
  * Each image is checked after it is rasterised, and redrawn when the check fails. The check
    looks at pixels only (value > 0). The image must have exactly one 8-connected component per
    path. The two markers must lie in one component for label 1 and in two components for
    label 0. There must be exactly two marker blobs, where a blob is a
    ``marker_core_size()``-square of lit pixels; paths are too thin to contain one. So the
    label can be read off the pixels with a connected-component labelling.

  Rasterisation uses ``antialias_scale`` x ``antialias_scale`` supersampling. A pixel is the
  fraction of its sub-samples that lie inside a stroke or marker, times ``255 * contrast``,
  rounded.

Layout (:func:`generate_dataset`, read by :func:`load_pathfinder`)
  The files follow LRA's ``lra_release/pathfinder{res}/{level_dir}`` layout:
  ``imgs/{shard}/sample_{j}.png`` are 8-bit grayscale PNGs. ``metadata/{shard}.npy`` is, despite
  its name, a text file with one line per image and space-separated columns. LRA's reader
  (``lra_benchmarks/data/pathfinder.py``) uses column 0 (image folder, relative to the level
  folder), column 1 (file name) and column 3 (label). The columns written here are:
  ``imgs/{shard} sample_{j}.png j label contour_length distractor_length num_distractors
  paddle_length paddle_thickness paddle_margin contrast``.

Splits (:func:`load_pathfinder`)
  LRA loads one level as a TFDS dataset and takes its ``[:80%]``, ``[80%:90%]`` and ``[90%:]``
  slices (``lra_benchmarks/image/input_pipeline.py``). TFDS stores examples in an order set by
  a hash of their keys. By default (``data.split_hash="blake2b"``) the images are ordered by a
  BLAKE2b hash of ``(seed, folder, file name)`` and then cut in the same proportions: LRA's
  sizes, not LRA's members. ``data.split_hash="lra"`` gives LRA's members (:func:`lra_order`):
  LRA's builder (``Pathfinder32/128._build_pcollection`` in ``lra_benchmarks/data/
  pathfinder.py``) keys each row ``f"{column 0}_{column 1}_{line}"`` (``line``: the row's
  1-based line in its metadata file); tfds's writer stores a split sorted by the 128-bit MD5 of
  the split name (``easy``/``intermediate``/``hard``, the salt) followed by the key
  (``tensorflow_datasets/core/hashing.py``, ``writer.py``), and ``[a%:b%]`` reads the stored
  rows ``round(a * n / 100)`` to ``round(b * n / 100)`` (``splits.py``,
  ``_pct_to_abs_closest``). LRA drops empty PNGs after slicing, so here too. Either way the
  split does not depend on the order in which files are listed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import hashlib
import io
import json
import math
import os
import tempfile
import time
import warnings
from typing import Any, Iterator, Sequence

import numpy as np
import tqdm

from simpletron_jax.data import workers as worker_pool
from simpletron_jax.data.common import RaggedExamples

LEVELS: dict[str, str] = {"easy": "curv_baseline", "intermediate": "curv_contour_length_9",
                          "hard": "curv_contour_length_14"}
"""Difficulty name -> folder name used by LRA's release (``Pathfinder32._split_generators``)."""
CONTOUR_LENGTHS: dict[str, int] = {"easy": 6, "intermediate": 9, "hard": 14}
"""Difficulty name -> paddles per long path."""
RESOLUTIONS = (32, 128)
NUM_CLASSES = 2
VOCAB_SIZE = 256
"""Tokens are the pixel values 0..255. Black (0) is a real token, so examples carry an
explicit mask (``RaggedExamples.explicit_mask``)."""
IMAGES_PER_SHARD = 1000
"""Images per ``imgs/{shard}`` folder and ``metadata/{shard}.npy`` file."""


@dataclasses.dataclass(frozen=True)
class PathfinderParams:
  """Settings of one Pathfinder resolution and level. Lengths are in output pixels.

  Attributes:
    resolution: image height and width.
    contour_length: paddles in each of the two long paths.
    paddle_length: length of one paddle (stroke), centre line.
    paddle_thickness: stroke width.
    paddle_margins: clearance choices. Each image draws one value, the number of dark pixels
      that must separate different paths (Chebyshev distance > margin). Each must be >= 1.
    contrast: intensity of strokes and markers, as a fraction of 255.
    marker_radius: marker disc radius.
    distractor_length: paddles per distractor path.
    num_distractors: number of distractor paths.
    seed_distance: least distance between the two marker centres, and between the two ends
      of each long path.
    marker_distance_tolerance: path 1 must have an end whose distance from an end of path 0
      differs from the distance between path 0's two ends by at most this much; a negative's
      markers go on such a pair. So the marker distance has nearly the same distribution in
      both classes and gives the label away no more than this tolerance allows.
    padding: strokes keep this many pixels away from the image border.
    antialias_scale: supersampling factor per axis.
    max_turn_deg: largest turn between consecutive paddles, in degrees.
    step_tries, path_tries, max_attempts: search budgets. A paddle is redrawn up to
      ``step_tries`` times, a path restarted up to ``path_tries`` times, and an image redrawn
      up to ``max_attempts`` times.
  """

  resolution: int
  contour_length: int
  paddle_length: float
  paddle_thickness: float
  paddle_margins: tuple[int, ...]
  contrast: float
  marker_radius: float
  distractor_length: int
  num_distractors: int
  seed_distance: float
  marker_distance_tolerance: float
  padding: int = 1
  antialias_scale: int = 2
  max_turn_deg: float = 30.0
  step_tries: int = 10
  path_tries: int = 40
  max_attempts: int = 100

  def __post_init__(self):
    ints = ("resolution", "contour_length", "distractor_length", "num_distractors",
            "antialias_scale", "step_tries", "path_tries", "max_attempts")
    for name in ints:
      if int(getattr(self, name)) < 1:
        raise ValueError(f"PathfinderParams.{name} must be >= 1, got {getattr(self, name)}")
    if not self.paddle_margins or min(self.paddle_margins) < 1:
      raise ValueError(f"PathfinderParams.paddle_margins must be ints >= 1, got "
                       f"{self.paddle_margins}")
    if self.paddle_length <= 0 or self.paddle_thickness <= 0 or self.marker_radius <= 0:
      raise ValueError("PathfinderParams: paddle_length, paddle_thickness and marker_radius "
                       "must be > 0")
    if not 0 < self.contrast <= 1:
      raise ValueError(f"PathfinderParams.contrast must be in (0, 1], got {self.contrast}")
    if 255 * self.contrast / self.antialias_scale**2 < 0.5:
      raise ValueError("PathfinderParams.contrast is so low that a pixel with one lit "
                       "sub-sample rounds to 0")
    if self.padding < 0:
      raise ValueError(f"PathfinderParams.padding must be >= 0, got {self.padding}")
    if self.marker_distance_tolerance < 0:
      raise ValueError(f"PathfinderParams.marker_distance_tolerance must be >= 0, got "
                       f"{self.marker_distance_tolerance}")
    if not 0 <= self.max_turn_deg <= 180:
      raise ValueError(f"PathfinderParams.max_turn_deg must be in [0, 180], got "
                       f"{self.max_turn_deg}")
    window = max(2 * math.ceil(self.paddle_length + self.paddle_thickness / 2 + 1 / 8),
                 2 * math.ceil(self.marker_radius)) + 1
    if window + 2 * max(self.paddle_margins) > 62:
      raise ValueError("PathfinderParams: paddle_length + paddle_thickness / 2 (or "
                       "marker_radius) + paddle_margin must stay below about 25 pixels, the "
                       "reach of the 62-bit row masks")

  @property
  def num_paths(self) -> int:
    """Paths per image: the two long paths plus the distractors."""
    return 2 + self.num_distractors

  def marker_core_size(self) -> int:
    """Side ``k`` (odd) of the largest pixel square around a marker centre that is fully lit.

    The nearest sub-sample of the pixel ``j`` rows and ``j`` columns from the centre pixel lies
    ``sqrt(2) * (j - 1/2 + 1/(2 * antialias_scale))`` from the centre. Strokes are too thin to
    hold a lit ``k x k`` square, so eroding the lit mask by it leaves the markers only.
    """
    s = self.antialias_scale
    j = 0
    while math.sqrt(2) * (j + 0.5 + 0.5 / s) <= self.marker_radius + 1e-9:
      j += 1
    return 2 * j + 1


def params_for(resolution: int, level: str) -> PathfinderParams:
  """The settings of one LRA Pathfinder resolution and level.

  The numbers are the ones LRA lists for ``drewlinsley/pathfinder`` in
  ``lra_benchmarks/data/pathfinder.py``:

  * 32x32: paddle length 2, thickness 0.5, margin 1, contrast 0.75, marker radius 1.5,
    padding 1, supersampling 2, seed distance 7, ``contour_length // 3`` paddles per distractor
    and ``20 // (contour_length // 3)`` distractors.
  * 128x128 (Path-X): thickness 1.5, margin 2 or 3, contrast 0.9, marker radius 3, padding 1,
    supersampling 2, seed distance 20, ``35 // (contour_length // 3)`` distractors (LRA writes
    ``35 / (14 / 3)`` = 7.5). LRA does not list the paddle length for 128; 5 is used here, an
    assumption.

  Levels set the long-path length: easy 6, intermediate 9, hard 14 paddles. This project's
  choices: the largest turn between paddles, 30 degrees (LRA lists ``continuity`` 1.0 (32) and
  1.8 (128) for the original without saying what it measures, so it is not used), and the
  marker distance tolerance, 1.5 pixels (32) and 5 pixels (128).

  Args:
    resolution: 32 or 128.
    level: ``easy``, ``intermediate``, ``hard``, or the folder names in :data:`LEVELS`.

  Returns:
    The frozen settings.

  Raises:
    ValueError: for another resolution or level; the message names ``data.resolution`` or
      ``data.level``.
  """
  level = _level_name(level)
  contour = CONTOUR_LENGTHS[level]
  distractor = contour // 3
  if resolution == 32:
    return PathfinderParams(resolution=32, contour_length=contour, paddle_length=2.0,
                            paddle_thickness=0.5, paddle_margins=(1,), contrast=0.75,
                            marker_radius=1.5, distractor_length=distractor,
                            num_distractors=20 // distractor, seed_distance=7.0,
                            marker_distance_tolerance=1.5)
  if resolution == 128:
    return PathfinderParams(resolution=128, contour_length=contour, paddle_length=5.0,
                            paddle_thickness=1.5, paddle_margins=(2, 3), contrast=0.9,
                            marker_radius=3.0, distractor_length=distractor,
                            num_distractors=35 // distractor, seed_distance=20.0,
                            marker_distance_tolerance=5.0)
  raise ValueError(f"data.resolution must be one of {RESOLUTIONS}, got {resolution!r}")


def _level_name(level: str) -> str:
  """``easy``/``intermediate``/``hard`` from a level name or an LRA folder name."""
  if level in LEVELS:
    return level
  for name, folder in LEVELS.items():
    if level == folder:
      return name
  raise ValueError(f"data.level must be one of {sorted(LEVELS)} or {sorted(LEVELS.values())}, "
                   f"got {level!r}")


# ----------------------------------------------------------------------------
# Geometry. Path vertices lie on a lattice of 1/_Q pixel and headings are whole degrees, so
# every paddle's masks come from a table built once per setting. While a scene is drawn, the
# pixels that a new path may not light are kept as one Python int per row (bit c = column c),
# which makes the many small collision tests cheap.

_Q = 8
"""Lattice points per pixel for path vertices."""
_ANGLES = 360
"""Heading resolution: one degree."""
_START_TRIES = 16
"""Start points drawn per walk; the first on a free pixel is used."""

_Rows = tuple[tuple[int, int], ...]
"""A mask as ``(row offset, column bits)`` pairs for its non-empty rows."""


def _capsule_mask(xs: np.ndarray, ys: np.ndarray, dx: float, dy: float,
                  radius: float) -> np.ndarray:
  """Points within ``radius`` of the segment from the origin to ``(dx, dy)``.

  Args:
    xs, ys: broadcastable coordinate arrays (pixels, relative to the segment start).
    dx, dy: the segment's end (a zero segment is a disc).
    radius: half the stroke width.

  Returns:
    A bool array of the broadcast shape.
  """
  l2 = dx * dx + dy * dy
  if l2 > 0:
    t = np.clip((xs * dx + ys * dy) * (1.0 / l2), 0.0, 1.0)
    ex, ey = xs - t * dx, ys - t * dy
  else:
    ex, ey = xs, ys
  return ex * ex + ey * ey <= radius * radius + 1e-9


def _grow(masks_NxHxW: np.ndarray, m: int) -> np.ndarray:
  """Dilates each mask by a ``(2m + 1)`` square: ``[N, H, W] -> [N, H + 2m, W + 2m]``."""
  n, h, w = masks_NxHxW.shape
  tall = np.zeros((n, h + 2 * m, w), bool)
  for dr in range(2 * m + 1):
    tall[:, dr:dr + h] |= masks_NxHxW
  out = np.zeros((n, h + 2 * m, w + 2 * m), bool)
  for dc in range(2 * m + 1):
    out[:, :, dc:dc + w] |= tall
  return out


def _row_bits(masks_NxHxW: np.ndarray) -> list[_Rows]:
  """Each ``[H, W]`` mask (W <= 62) as :data:`_Rows`."""
  weights = 1 << np.arange(masks_NxHxW.shape[2], dtype=np.int64)
  ints = (masks_NxHxW.astype(np.int64) * weights).sum(axis=2).tolist()
  return [tuple((r, v) for r, v in enumerate(row) if v) for row in ints]


@dataclasses.dataclass(frozen=True)
class _Table:
  """Masks of every paddle and of the marker disc for one setting.

  A paddle starting at lattice point ``(x, y)`` with heading ``a`` degrees has index
  ``key = (a * _Q + y % _Q) * _Q + x % _Q`` and ends at ``(x + step_x[a], y + step_y[a])``.
  Its window is ``width x width`` pixels with top-left pixel ``(y // _Q - reach,
  x // _Q - reach)``; ``sub[key]`` (``[width * s, width * s]``) marks the lit sub-samples and
  ``rows[key]`` the lit pixels. The marker disc is centred on a pixel centre; its window is
  ``disc_width`` pixels wide with that pixel at ``(disc_reach, disc_reach)``, and its lit pixels
  lie at most ``disc_extent`` pixels from it.
  """

  reach: int
  width: int
  step_x: tuple[int, ...]
  step_y: tuple[int, ...]
  sub: np.ndarray
  pix: np.ndarray
  rows: list[_Rows]
  disc_reach: int
  disc_width: int
  disc_extent: int
  disc_sub: np.ndarray
  disc_pix: np.ndarray
  disc_rows: _Rows
  cache: dict = dataclasses.field(default_factory=dict, compare=False)

  def grown_rows(self, m: int) -> tuple[list[_Rows], _Rows]:
    """Paddle and disc pixel masks dilated by ``m`` (windows start ``m`` up and left)."""
    if m not in self.cache:
      self.cache[m] = (_row_bits(_grow(self.pix, m)), _row_bits(_grow(self.disc_pix[None], m))[0])
    return self.cache[m]


@functools.lru_cache(maxsize=8)
def _table(paddle_length: float, paddle_thickness: float, marker_radius: float,
           s: int) -> _Table:
  """Builds the masks for one setting (a fraction of a second; cached per process)."""
  rad = 0.5 * paddle_thickness
  reach = math.ceil(paddle_length + rad + 1.0 / _Q)
  width = 2 * reach + 1
  theta = np.deg2rad(np.arange(_ANGLES))
  step_x = np.rint(paddle_length * _Q * np.cos(theta)).astype(np.int64)
  step_y = np.rint(paddle_length * _Q * np.sin(theta)).astype(np.int64)
  centres = (np.arange(width * s) + 0.5) / s - reach  # relative to the start pixel's corner
  rel = centres[None, :] - np.arange(_Q)[:, None] / _Q  # [offset, width * s]
  xs = rel[None, :, None, :]  # [1, x offset, 1, x]
  ys = rel[:, None, :, None]  # [y offset, 1, y, 1]
  sub = np.empty((_ANGLES, _Q, _Q, width * s, width * s), bool)
  for a in range(_ANGLES):
    sub[a] = _capsule_mask(xs, ys, step_x[a] / _Q, step_y[a] / _Q, rad)
  sub = sub.reshape(-1, width * s, width * s)
  pix = sub.reshape(-1, width, s, width, s).any(axis=(2, 4))

  disc_reach = math.ceil(marker_radius)
  disc_width = 2 * disc_reach + 1
  d = (np.arange(disc_width * s) + 0.5) / s - disc_reach - 0.5  # relative to the pixel centre
  disc_sub = _capsule_mask(d[None, :], d[:, None], 0.0, 0.0, marker_radius)
  disc_pix = disc_sub.reshape(disc_width, s, disc_width, s).any(axis=(1, 3))
  lit_r, lit_c = np.nonzero(disc_pix)
  disc_extent = int(max(np.abs(lit_r - disc_reach).max(), np.abs(lit_c - disc_reach).max()))
  for arr in (sub, pix, disc_sub, disc_pix):
    arr.setflags(write=False)
  return _Table(reach=reach, width=width, step_x=tuple(step_x.tolist()),
                step_y=tuple(step_y.tolist()), sub=sub, pix=pix, rows=_row_bits(pix),
                disc_reach=disc_reach, disc_width=disc_width, disc_extent=disc_extent,
                disc_sub=disc_sub, disc_pix=disc_pix, disc_rows=_row_bits(disc_pix[None])[0])


def _hits(rows: list[int], r0: int, c0: int, mask: _Rows) -> bool:
  """True when ``mask`` placed with its window's top-left at ``(r0, c0)`` meets a set bit."""
  for dr, bits in mask:
    if (rows[r0 + dr] >> c0) & bits:
      return True
  return False


def _paint(rows: list[int], r0: int, c0: int, mask: _Rows) -> None:
  """Sets the bits of ``mask`` placed with its window's top-left at ``(r0, c0)``."""
  for dr, bits in mask:
    rows[r0 + dr] |= bits << c0


class _Scene:
  """One image while it is drawn.

  Coordinates are "padded": pixel ``(r, c)`` of the image is ``(r + border, c + border)``;
  the border keeps every window, grown by the margin, inside. ``blocked`` holds one int per
  padded row, with a bit set for each pixel within ``margin`` of a claimed path or of a
  reserved marker zone (the marker discs at both ends of both long paths, drawn or not).
  ``shapes`` collects ``(row, col, sub-sample mask)`` of everything drawn.
  """

  def __init__(self, p: PathfinderParams, margin: int):
    self.p = p
    self.margin = margin
    self.table = _table(p.paddle_length, p.paddle_thickness, p.marker_radius,
                        p.antialias_scale)
    self.border = max(self.table.reach, self.table.disc_reach) + max(p.paddle_margins) + 1
    self.blocked = [0] * (p.resolution + 2 * self.border)
    self.grown, self.disc_grown = self.table.grown_rows(margin)
    self.shapes: list[tuple[int, int, np.ndarray]] = []

  def claim_path(self, paddles: Sequence[tuple[int, int, int]]) -> None:
    """Blocks the surroundings of ``(row, col, key)`` paddles and draws them."""
    m = self.margin
    for rr, cc, key in paddles:
      _paint(self.blocked, rr - m, cc - m, self.grown[key])
      self.shapes.append((rr, cc, self.table.sub[key]))

  def reserve_disc(self, rr: int, cc: int) -> None:
    """Blocks the surroundings of the marker disc with window top-left ``(rr, cc)``."""
    _paint(self.blocked, rr - self.margin, cc - self.margin, self.disc_grown)

  def draw_disc(self, rr: int, cc: int) -> None:
    """Draws the marker disc with window top-left ``(rr, cc)``."""
    self.shapes.append((rr, cc, self.table.disc_sub))


def _walk(rng: np.random.Generator, scene: _Scene, n_segments: int,
          starts: list[tuple[int, int]] | None = None):
  """One path of ``n_segments`` paddles that lights no blocked pixel, or None.

  A random walk with backtracking. At each vertex ``step_tries`` candidate headings are drawn:
  uniform for the first paddle, and for later ones the previous heading turned by a whole
  number of degrees uniform in ``[-max_turn_deg, max_turn_deg]``. The first candidate that
  stays in the padded area, lights no blocked pixel and keeps the margin from this path's
  paddles more than two back is taken. When none is left, the previous paddle moves on to its
  next candidate. The walk gives up after ``3 * n_segments + 8`` fresh vertex visits.

  Args:
    rng: the random source.
    scene: the image being drawn.
    n_segments: paddles in the path.
    starts: candidate start points (lattice ``(x, y)``); the first inside the padded area on
      a free pixel is used. Default: ``_START_TRIES`` uniform points.

  Returns:
    ``(paddles, start, end)``: the paddles as ``(row, col, key)`` (padded window top-left and
    table index), and the first and last vertex as lattice points ``(x, y)``.
  """
  p, t = scene.p, scene.table
  m, b, reach = scene.margin, scene.border, t.reach
  rad = 0.5 * p.paddle_thickness
  lo = math.ceil((p.padding + rad) * _Q)
  hi = math.floor((p.resolution - p.padding - rad) * _Q)
  turn = int(round(p.max_turn_deg))
  tries = p.step_tries
  max_visits = 3 * n_segments + 8
  blocked, rows, grown, step_x, step_y = scene.blocked, t.rows, scene.grown, t.step_x, t.step_y
  # All random draws up front (numpy's scalar draws are slow); unused ones are discarded.
  if starts is None:
    starts = rng.integers(lo, hi + 1, size=(_START_TRIES, 2)).tolist()
  first = rng.integers(_ANGLES, size=tries).tolist()
  turns = rng.integers(-turn, turn + 1, size=max_visits * tries).tolist()
  for x0, y0 in starts:
    if lo <= x0 <= hi and lo <= y0 <= hi and not (blocked[y0 // _Q + b] >> (x0 // _Q + b)) & 1:
      break
  else:
    return None
  # This path's own paddles more than two back, grown by the margin: one snapshot per
  # paddle that has aged, so that a backtrack pops one.
  aged_stack = [[0] * len(blocked)]
  paddles: list[tuple[int, int, int]] = []
  vertices = [(x0, y0, 0)]  # (x, y, heading of the paddle ending here)
  pending: list[list[int]] = []  # per vertex: candidate headings not yet tried, last first
  visits = 0
  while len(paddles) < n_segments:
    k = len(paddles)
    x, y, heading = vertices[k]
    if len(pending) == k:  # a fresh vertex: draw its candidates
      if visits == max_visits:
        return None
      if k == 0:
        pending.append(first[::-1])
      else:
        drawn = turns[visits * tries:(visits + 1) * tries]
        pending.append([(heading + d) % _ANGLES for d in reversed(drawn)])
      visits += 1
    fx, fy = x % _Q, y % _Q
    rr, cc = y // _Q - reach + b, x // _Q - reach + b
    candidates = pending[k]
    aged = aged_stack[-1]
    while candidates:
      a = candidates.pop()
      x1, y1 = x + step_x[a], y + step_y[a]
      if not (lo <= x1 <= hi and lo <= y1 <= hi):
        continue
      key = (a * _Q + fy) * _Q + fx
      for dr, bits in rows[key]:
        if ((blocked[rr + dr] | aged[rr + dr]) >> cc) & bits:
          break
      else:
        paddles.append((rr, cc, key))
        vertices.append((x1, y1, a))
        if k >= 2:  # paddle k - 2 is now more than two back from the next vertex
          r2, c2, key2 = paddles[k - 2]
          aged = aged.copy()
          _paint(aged, r2 - m, c2 - m, grown[key2])
          aged_stack.append(aged)
        break
    else:  # stuck: move the previous paddle on to its next candidate
      if k == 0:
        return None
      pending.pop()
      vertices.pop()
      paddles.pop()
      if k >= 3:  # paddle k - 3 is again within two of the current vertex
        aged_stack.pop()
  return paddles, vertices[0][:2], vertices[-1][:2]


def _marker(scene: _Scene, xy: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
  """The marker disc on the pixel holding lattice point ``xy``.

  Returns:
    ``((row, col), (pixel_row, pixel_col))``: the disc window's padded top-left, and the
    centre pixel in image coordinates.
  """
  t, b = scene.table, scene.border
  row, col = xy[1] // _Q, xy[0] // _Q
  return (row - t.disc_reach + b, col - t.disc_reach + b), (row, col)


def _free(scene: _Scene, marker) -> bool:
  """True when a marker from :func:`_marker` lies inside the image and lights no blocked pixel."""
  (rr, cc), (row, col) = marker
  e, h = scene.table.disc_extent, scene.p.resolution
  if min(row, col) - e < 0 or max(row, col) + e >= h:
    return False
  return not _hits(scene.blocked, rr, cc, scene.table.disc_rows)


def _distance(a, b) -> float:
  """Distance in pixels between the centres of two markers from :func:`_marker`."""
  return math.hypot(a[1][0] - b[1][0], a[1][1] - b[1][1])


def _pairs(p: PathfinderParams, ends0, ends1) -> list[tuple[int, int]]:
  """End pairs ``(i, j)`` of path 0 and path 1 that may carry a negative's markers: as far
  apart as path 0's ends, within ``marker_distance_tolerance``, and >= ``seed_distance``."""
  target = _distance(ends0[0], ends0[1])
  return [(i, j) for i in range(2) for j in range(2)
          if abs(_distance(ends0[i], ends1[j]) - target) <= p.marker_distance_tolerance
          and _distance(ends0[i], ends1[j]) >= p.seed_distance]


def _long_path(rng: np.random.Generator, scene: _Scene, partner=None):
  """Draws a long path with free marker zones at both ends, ends >= ``seed_distance`` apart.

  The path and both zones are claimed; the discs are not drawn yet.

  Args:
    rng: the random source.
    scene: the image being drawn.
    partner: for path 1, the ends of path 0; the new path then starts on a ring around one
      of them and must offer a pair for :func:`_pairs`.

  Returns:
    ``[marker at the start, marker at the end]`` (see :func:`_marker`), or None.
  """
  p = scene.p
  for _ in range(p.path_tries):
    starts = None
    if partner is not None:
      # Start on a ring around an end of path 0 whose radius is the distance between path 0's
      # ends, so that the start usually forms a pair for _pairs.
      target = _distance(partner[0], partner[1])
      which = rng.integers(2, size=_START_TRIES).tolist()
      phi = rng.uniform(0.0, 2.0 * math.pi, size=_START_TRIES)
      radius = target + rng.uniform(-0.5, 0.5, size=_START_TRIES) * p.marker_distance_tolerance
      starts = []
      for w, f, r in zip(which, phi.tolist(), radius.tolist()):
        row, col = partner[w][1]
        starts.append((math.floor((col + 0.5 + r * math.cos(f)) * _Q),
                       math.floor((row + 0.5 + r * math.sin(f)) * _Q)))
    walked = _walk(rng, scene, p.contour_length, starts)
    if walked is None:
      continue
    paddles, start, end = walked
    ends = [_marker(scene, start), _marker(scene, end)]
    if _distance(ends[0], ends[1]) < p.seed_distance:
      continue
    if partner is not None and not _pairs(p, partner, ends):
      continue
    # The path may touch its own zones; only other paths must keep clear of them.
    if not all(_free(scene, e) for e in ends):
      continue
    scene.claim_path(paddles)
    for (rr, cc), _ in ends:
      scene.reserve_disc(rr, cc)
    return ends
  return None


def _try_image(rng: np.random.Generator, p: PathfinderParams, label: int,
               margin: int) -> tuple[np.ndarray, dict[str, Any]] | None:
  """One attempt at an image with the given label; None when it must be redrawn."""
  from scipy import ndimage  # pylint: disable=import-outside-toplevel

  # The scene does not depend on the label; only where the markers go does.
  scene = _Scene(p, margin)
  ends0 = _long_path(rng, scene)
  if ends0 is None:
    return None
  ends1 = _long_path(rng, scene, partner=ends0)
  if ends1 is None:
    return None
  pairs = _pairs(p, ends0, ends1)
  i, j = pairs[int(rng.integers(len(pairs)))]
  chosen = list(ends0) if label else [ends0[i], ends1[j]]
  for (rr, cc), _ in chosen:
    scene.draw_disc(rr, cc)
  for _ in range(p.num_distractors):
    for _ in range(p.path_tries):
      walked = _walk(rng, scene, p.distractor_length)
      if walked is not None:
        break
    else:
      return None
    scene.claim_path(walked[0])

  h, s, b = p.resolution, p.antialias_scale, scene.border
  size = (h + 2 * b) * s
  canvas = np.zeros((size, size), bool)
  for rr, cc, sub in scene.shapes:
    sh, sw = sub.shape
    canvas[rr * s:rr * s + sh, cc * s:cc * s + sw] |= sub
  canvas = canvas[b * s:(b + h) * s, b * s:(b + h) * s]
  lit = canvas.reshape(h, s, h, s).sum(axis=(1, 3))
  image = np.rint(lit * (255.0 * p.contrast / (s * s))).astype(np.uint8)

  # Pixel-level check of the label (see the module docstring).
  eight = np.ones((3, 3), bool)
  on = image > 0
  components, count = ndimage.label(on, structure=eight)
  if count != p.num_paths:
    return None
  (ra, ca), (rb, cb) = chosen[0][1], chosen[1][1]
  if components[ra, ca] == 0 or components[rb, cb] == 0:
    return None
  if (components[ra, ca] == components[rb, cb]) != bool(label):
    return None
  k = p.marker_core_size()
  core = ndimage.binary_erosion(on, structure=np.ones((k, k), bool))
  if ndimage.label(core, structure=eight)[1] != 2 or not (core[ra, ca] and core[rb, cb]):
    return None
  return image, {"markers": ((ra, ca), (rb, cb)), "margin": margin,
                 "path_ends": tuple(tuple(e[1] for e in ends) for ends in (ends0, ends1))}


def render_example_info(rng: np.random.Generator, params: PathfinderParams,
                        label: int | None = None) -> tuple[np.ndarray, int, dict[str, Any]]:
  """Like :func:`render_example`, plus facts about the drawing.

  Args:
    rng: the random source; it is advanced.
    params: the settings.
    label: if given, overrides the coin (which is still drawn), so the same ``rng`` state
      gives the same scene with the other label's markers.

  Returns:
    ``(image, label, info)``. ``info`` has ``markers`` (the two marker centre pixels as
    ``(row, col)``), ``path_ends`` (the end pixels of long paths 0 and 1), ``margin`` (the
    clearance used), ``attempts`` (1 when the first drawing passed the check), ``num_paths``,
    ``contour_length`` and ``distractor_length``.

  Raises:
    RuntimeError: if ``params.max_attempts`` drawings all fail (settings too crowded).
  """
  coin = int(rng.integers(2))
  label = coin if label is None else int(label)
  margin = int(rng.choice(np.asarray(params.paddle_margins)))
  for attempt in range(1, params.max_attempts + 1):
    result = _try_image(rng, params, label, margin)
    if result is not None:
      image, info = result
      info.update(attempts=attempt, num_paths=params.num_paths,
                  contour_length=params.contour_length,
                  distractor_length=params.distractor_length)
      return image, label, info
  raise RuntimeError(f"no valid Pathfinder image in {params.max_attempts} attempts; the "
                     f"settings are too crowded: {params}")


def render_example(rng: np.random.Generator, params: PathfinderParams) -> tuple[np.ndarray, int]:
  """Draws one Pathfinder image (Linsley et al. 2018; LRA's Pathfinder/Path-X).

  The label is drawn first (a fair coin), then the scene is drawn for it; see the module
  docstring for the drawing and the pixel-level check it passes. The result is a pure function
  of the state of ``rng``.

  Args:
    rng: the random source; it is advanced.
    params: the settings, e.g. ``params_for(32, "hard")``.

  Returns:
    ``(image, label)``: ``image`` is ``[resolution, resolution]`` uint8 (0 = black), ``label``
    is 1 when one path joins the two markers, else 0.

  Raises:
    RuntimeError: if ``params.max_attempts`` drawings all fail.
  """
  image, label, _ = render_example_info(rng, params)
  return image, label


def example_rng(seed: int, params: PathfinderParams, index: int) -> np.random.Generator:
  """The random source of image ``index`` of a data set: seeded by ``(seed, resolution,
  contour_length, index)``, so an image does not depend on how the work is split."""
  return np.random.default_rng([int(seed), params.resolution, params.contour_length,
                                int(index)])


# ----------------------------------------------------------------------------
# Writing LRA's layout.


@contextlib.contextmanager
def _atomic_path(path: str) -> Iterator[str]:
  """Yields a temporary path beside ``path``; on a clean exit it replaces ``path``."""
  directory = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                             dir=directory)
  os.close(fd)
  try:
    yield tmp
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(tmp)
    raise


def _write_text(path: str, text: str) -> None:
  with _atomic_path(path) as tmp:
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
      f.write(text)


def _png_bytes(image: np.ndarray) -> bytes:
  from PIL import Image  # pylint: disable=import-outside-toplevel
  buffer = io.BytesIO()
  Image.fromarray(image, mode="L").save(buffer, format="PNG")
  return buffer.getvalue()


def _render_chunk(task: tuple) -> tuple[int, int, list[int], list[int], list[int]]:
  """Worker: renders images ``start..stop-1`` of one shard and writes their PNGs.

  Args:
    task: ``(seed, params, level_dir, shard, start, stop, images_per_shard)``.

  Returns:
    ``(shard, start, labels, margins, attempts)``.
  """
  seed, params, level_dir, shard, start, stop, per_shard = task
  folder = os.path.join(level_dir, "imgs", str(shard))
  labels, margins, attempts = [], [], []
  for j in range(start, stop):
    rng = example_rng(seed, params, shard * per_shard + j)
    image, label, info = render_example_info(rng, params)
    path = os.path.join(folder, f"sample_{j}.png")
    # One writer per file, so a fixed temporary name is safe; the rename makes it atomic.
    with open(path + ".tmp", "wb") as f:
      f.write(_png_bytes(image))
    os.replace(path + ".tmp", path)
    labels.append(label)
    margins.append(info["margin"])
    attempts.append(info["attempts"])
  return shard, start, labels, margins, attempts


def _default_workers() -> int:
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # Not Linux.
    return os.cpu_count() or 1


_META_FORMAT = "simpletron_jax.data.pathfinder/1"
_DONE_FILE = "simpletron_generated.json"
_CHUNK = 25  # images per worker task


def _metadata_line(shard: int, j: int, label: int, margin: int, p: PathfinderParams) -> str:
  return (f"imgs/{shard} sample_{j}.png {j} {label} {p.contour_length} {p.distractor_length} "
          f"{p.num_distractors} {p.paddle_length:g} {p.paddle_thickness:g} {margin} "
          f"{p.contrast:g}\n")


def generate_dataset(out_dir: str, *, seed: int, resolution: int = 32, level: str = "hard",
                     num_images: int, num_workers: int | None = None, progress: bool = True,
                     images_per_shard: int = IMAGES_PER_SHARD) -> dict[str, Any]:
  """Generates a Pathfinder level and writes it in LRA's layout.

  Writes ``{out_dir}/pathfinder{resolution}/{level_dir}/imgs/{shard}/sample_{j}.png`` and
  ``.../metadata/{shard}.npy`` (text, see the module docstring), where image ``i`` is
  ``j = i % images_per_shard`` of shard ``i // images_per_shard``. Image ``i`` is
  ``render_example(example_rng(seed, params, i), params)``, so the files do not depend on
  ``num_workers``. Every file is written to a temporary name and renamed. A metadata file is
  written once its shard is complete, and ``simpletron_generated.json`` (the arguments, the
  time taken and the redraw statistics) last. Old ``metadata/*.npy`` files are removed first.

  Args:
    out_dir: the root folder, created if missing. Pass it to :func:`load_pathfinder`.
    seed: the data seed.
    resolution: 32 or 128.
    level: ``easy``, ``intermediate`` or ``hard`` (or an LRA folder name).
    num_images: images to make, >= 1.
    num_workers: processes; None means every CPU this process may use, 1 means this process.
    progress: show a tqdm bar and print the speed.
    images_per_shard: images per shard folder (layout only; the images do not change).

  Returns:
    ``{"level_dir", "num_images", "seconds", "images_per_second", "positive_fraction",
    "redrawn_fraction", "mean_attempts"}``. ``redrawn_fraction`` is the fraction of images
    whose first drawing failed the pixel check.

  Raises:
    ValueError: for a bad resolution, level, count or worker number.
    RuntimeError: if an image cannot be drawn (see :func:`render_example`).
  """
  params = params_for(resolution, level)
  level_dir = os.path.join(os.path.expanduser(out_dir), f"pathfinder{resolution}",
                           LEVELS[_level_name(level)])
  if int(num_images) < 1 or int(images_per_shard) < 1:
    raise ValueError(f"num_images and images_per_shard must be >= 1, got {num_images}, "
                     f"{images_per_shard}")
  workers = _default_workers() if num_workers is None else int(num_workers)
  if workers < 1:
    raise ValueError(f"num_workers must be >= 1, got {num_workers}")
  num_images, per_shard = int(num_images), int(images_per_shard)
  num_shards = -(-num_images // per_shard)
  meta_dir = os.path.join(level_dir, "metadata")
  os.makedirs(meta_dir, exist_ok=True)
  with contextlib.suppress(FileNotFoundError):
    os.unlink(os.path.join(level_dir, _DONE_FILE))
  for old in glob.glob(os.path.join(meta_dir, "*.npy")):
    os.unlink(old)
  tasks = []
  for shard in range(num_shards):
    os.makedirs(os.path.join(level_dir, "imgs", str(shard)), exist_ok=True)
    size = min(per_shard, num_images - shard * per_shard)
    tasks += [(int(seed), params, level_dir, shard, start, min(start + _CHUNK, size), per_shard)
              for start in range(0, size, _CHUNK)]

  labels = np.zeros(num_images, np.int64)
  margins = np.zeros(num_images, np.int64)
  attempts = np.zeros(num_images, np.int64)
  remaining = [min(per_shard, num_images - s * per_shard) for s in range(num_shards)]
  start_time = time.time()
  bar = tqdm.tqdm(total=num_images, desc=f"Pathfinder{resolution} {level}", unit="img",
                  disable=not progress, smoothing=0.05)
  # Spawned workers, not forked: the caller may run JAX threads (worker_pool).
  with bar, worker_pool.executor(workers, len(tasks)) as pool:
    for shard, start, lab, mar, att in worker_pool.results(pool, _render_chunk, tasks,
                                                           ordered=False, what="Pathfinder"):
      first = shard * per_shard + start
      labels[first:first + len(lab)] = lab
      margins[first:first + len(lab)] = mar
      attempts[first:first + len(lab)] = att
      bar.update(len(lab))
      remaining[shard] -= len(lab)
      if remaining[shard] == 0:
        base = shard * per_shard
        size = min(per_shard, num_images - base)
        _write_text(os.path.join(meta_dir, f"{shard}.npy"), "".join(
            _metadata_line(shard, j, int(labels[base + j]), int(margins[base + j]), params)
            for j in range(size)))
  seconds = time.time() - start_time
  stats = {"level_dir": level_dir, "num_images": num_images, "seconds": round(seconds, 3),
           "images_per_second": round(num_images / max(seconds, 1e-9), 1),
           "positive_fraction": float(labels.mean()),
           "redrawn_fraction": float((attempts > 1).mean()),
           "mean_attempts": float(attempts.mean())}
  _write_text(os.path.join(level_dir, _DONE_FILE), json.dumps(
      {"format": _META_FORMAT, "arguments": _generator_args(seed, resolution, level, num_images,
                                                            per_shard),
       "params": dataclasses.asdict(params), "stats": stats}, indent=2, sort_keys=True) + "\n")
  if progress:
    print(f"Pathfinder{resolution} {level}: {num_images} images in {seconds:.1f} s "
          f"({stats['images_per_second']} images/s, {workers} worker(s)); "
          f"{100 * stats['redrawn_fraction']:.2f}% redrawn")
  return stats


def _generator_args(seed: int, resolution: int, level: str, num_images: int,
                    images_per_shard: int) -> dict[str, Any]:
  return {"seed": int(seed), "resolution": int(resolution), "level": _level_name(level),
          "num_images": int(num_images), "images_per_shard": int(images_per_shard)}


def ensure_generated(cache_dir: str, *, seed: int, resolution: int = 32, level: str = "hard",
                     num_images: int, num_workers: int | None = None, progress: bool = True,
                     images_per_shard: int = IMAGES_PER_SHARD) -> str:
  """Returns a root folder holding this generated Pathfinder level, generating it if needed.

  The folder is ``{cache_dir}/seed{seed}_n{num_images}``. The level is generated with
  :func:`generate_dataset` unless its ``simpletron_generated.json`` exists with the same
  arguments, settings (:class:`PathfinderParams`) and format version, and every metadata file
  is present.

  Args:
    cache_dir: parent folder, created if missing.
    seed, resolution, level, num_images, num_workers, progress, images_per_shard: as for
      :func:`generate_dataset` (``num_workers`` and ``progress`` are not part of the key).

  Returns:
    The root folder; pass it to :func:`load_pathfinder` as ``data_dir``.

  Raises:
    ValueError, RuntimeError: as :func:`generate_dataset`.
  """
  params = params_for(resolution, level)
  args = _generator_args(seed, resolution, level, num_images, images_per_shard)
  root = os.path.join(os.path.expanduser(cache_dir), f"seed{int(seed)}_n{int(num_images)}")
  level_dir = os.path.join(root, f"pathfinder{resolution}", LEVELS[args["level"]])
  try:
    with open(os.path.join(level_dir, _DONE_FILE), encoding="utf-8") as f:
      done = json.load(f)
  except (OSError, ValueError):
    done = None
  shards = -(-int(num_images) // int(images_per_shard))
  up_to_date = (isinstance(done, dict) and done.get("format") == _META_FORMAT
                and done.get("arguments") == args
                and done.get("params") == json.loads(json.dumps(dataclasses.asdict(params)))
                and all(os.path.isfile(os.path.join(level_dir, "metadata", f"{s}.npy"))
                        for s in range(shards)))
  if not up_to_date:
    generate_dataset(root, seed=seed, resolution=resolution, level=level,
                     num_images=num_images, num_workers=num_workers, progress=progress,
                     images_per_shard=images_per_shard)
  return root


# ----------------------------------------------------------------------------
# Reading LRA's layout.


def find_level_dir(data_dir: str, resolution: int, level: str) -> str:
  """The folder of one level inside ``data_dir``.

  Tries, in order: ``{data_dir}/pathfinder{res}/{level_dir}`` (LRA's ``lra_release`` folder or
  a generated root), ``{data_dir}/lra_release/pathfinder{res}/{level_dir}``,
  ``{data_dir}/{level_dir}`` (a ``pathfinder{res}`` folder) and ``data_dir`` itself when it has
  a ``metadata`` folder.

  Raises:
    FileNotFoundError: when none has a ``metadata`` folder; the message names
      ``data.data_dir`` and the paths tried.
  """
  data_dir = os.path.expanduser(data_dir)
  folder = LEVELS[_level_name(level)]
  tries = [os.path.join(data_dir, f"pathfinder{resolution}", folder),
           os.path.join(data_dir, "lra_release", f"pathfinder{resolution}", folder),
           os.path.join(data_dir, folder), data_dir]
  for path in tries:
    if os.path.isdir(os.path.join(path, "metadata")):
      return path
  raise FileNotFoundError(
      f"no Pathfinder {resolution}x{resolution} '{folder}' folder in data.data_dir={data_dir!r}; "
      f"looked for a 'metadata' folder in: {', '.join(tries)}. Point data.data_dir at LRA's "
      f"lra_release folder (from lra_release.gz) or leave it unset to generate the data.")


def _metadata_files(level_dir: str) -> list[str]:
  files = glob.glob(os.path.join(level_dir, "metadata", "*.npy"))
  stem = lambda f: os.path.splitext(os.path.basename(f))[0]  # noqa: E731
  return sorted(files, key=lambda f: (0, int(stem(f)), "") if stem(f).isdigit()
                else (1, 0, stem(f)))


def read_metadata(level_dir: str) -> list[tuple[str, str, int, str]]:
  """Rows of every ``metadata/*.npy`` file of a level, in numeric file order.

  Each file is text: lines of space-separated columns, of which column 0 is the image folder
  (relative to ``level_dir``), column 1 the file name and column 3 the label (as LRA reads
  them). Blank lines are skipped. A real ``.npy`` file (a 2-D string array, one row per
  image, as ``numpy.save`` writes it) is read too.

  Returns:
    ``(folder, file_name, label, where)`` tuples, ``where`` being ``"{metadata file}:{line}"``.

  Raises:
    FileNotFoundError: when there is no metadata file.
    ValueError: on a line with fewer than 4 columns or a label other than 0 or 1, naming the
      file and line; on a file that is neither UTF-8 text nor ``.npy``.
  """
  files = _metadata_files(level_dir)
  if not files:
    raise FileNotFoundError(f"no metadata/*.npy files in {level_dir} (data.data_dir)")
  rows = []
  for path in files:
    with open(path, "rb") as f:
      data = f.read()
    if data.startswith(b"\x93NUMPY"):
      try:
        table = np.load(io.BytesIO(data), allow_pickle=False)
      except ValueError as e:
        raise ValueError(f"{path}: cannot read this .npy metadata file ({e})") from None
      lines = [[str(v) for v in row] for row in np.atleast_2d(table).tolist()]
    else:
      try:
        lines = [line.split() for line in data.decode("utf-8").splitlines()]
      except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not a text metadata file ({e})") from None
    for line_number, cols in enumerate(lines, start=1):
      if not cols:
        continue
      where = f"{path}:{line_number}"
      if len(cols) < 4:
        raise ValueError(f"{where}: expected at least 4 space-separated columns (folder, "
                         f"file, index, label), found {len(cols)}")
      if cols[3] not in ("0", "1"):
        raise ValueError(f"{where}: label (column 3) must be 0 or 1, got {cols[3]!r}")
      rows.append((cols[0], cols[1], int(cols[3]), where))
  return rows


def _split_sizes(n: int, fractions: Sequence[float]) -> tuple[int, int, int]:
  if (len(fractions) != 3 or any(not math.isfinite(f) or f < 0 for f in fractions)
      or abs(sum(fractions) - 1.0) > 1e-6):
    raise ValueError(f"data.split_fractions must be three non-negative numbers summing to 1, "
                     f"got {tuple(fractions)}")
  train_end = int(round(fractions[0] * n))
  val_end = int(round((fractions[0] + fractions[1]) * n))
  return train_end, val_end - train_end, n - val_end


SPLIT_HASHES = ("blake2b", "lra")
"""Values of ``data.split_hash`` (see :func:`load_pathfinder`)."""


def lra_example_key(folder: str, file_name: str, line: int) -> str:
  """The key LRA's tfds builder gives a metadata row.

  ``lra_benchmarks/data/pathfinder.py`` (``_generate_examples`` of every ``Pathfinder*``
  builder) yields ``'_'.join([m_example[0], m_example[1], str(example_id)])``, where
  ``example_id`` counts the lines of one metadata file from 1. That equals the row's line
  number when the file ends with a newline and has no blank lines (LRA's reader fails on a
  blank line and drops a last line without a newline; this reader does neither).

  Args:
    folder: column 0 of the row (the image folder, e.g. ``imgs/0``).
    file_name: column 1 (e.g. ``sample_0.png``).
    line: the row's 1-based line number in its metadata file.

  Returns:
    The key, e.g. ``"imgs/0_sample_0.png_1"``.
  """
  return f"{folder}_{file_name}_{int(line)}"


def lra_hash(key: str, level: str) -> int:
  """tfds's hash of an example key: the 128-bit MD5 of the salt, then the key, in UTF-8.

  The salt is the tfds split name, which for LRA's builders is the level name (``easy``,
  ``intermediate``, ``hard``). This is ``tensorflow_datasets.core.hashing.Hasher(salt)
  .hash_key(key)`` (MD5 since tfds 1.x; tfds's writers store a split sorted by this value).

  Args:
    key: from :func:`lra_example_key`.
    level: ``easy``, ``intermediate``, ``hard`` or an LRA folder name.

  Returns:
    An int in ``[0, 2**128)``.

  Raises:
    ValueError: for a bad level (naming ``data.level``).
  """
  md5 = hashlib.md5(_level_name(level).encode("utf-8"))
  md5.update(key.replace("\\", "/").encode("utf-8"))   # tfds normalises backslashes
  return int(md5.hexdigest(), 16)


def lra_order(rows: Sequence[tuple[str, str, int]], level: str) -> list[int]:
  """Indices of ``rows`` in the order LRA's tfds copy of a level stores them.

  Args:
    rows: ``(folder, file_name, line)`` per metadata row (see :func:`lra_example_key`),
      empty PNGs included (LRA's builder writes them; its pipeline filters them after
      slicing).
    level: the level (the tfds split name; the hash salt).

  Returns:
    A permutation of ``range(len(rows))``: ascending :func:`lra_hash`.

  Raises:
    ValueError: for a bad level, or two rows with the same key (tfds refuses those too).
  """
  hashes = [lra_hash(lra_example_key(*row), level) for row in rows]
  order = sorted(range(len(rows)), key=hashes.__getitem__)
  for a, b in zip(order, order[1:]):
    if hashes[a] == hashes[b]:
      raise ValueError(f"two metadata rows have the same LRA key "
                       f"{lra_example_key(*rows[a])!r} (data.split_hash='lra')")
  return order


def lra_split_bounds(n: int, fractions: Sequence[float]) -> tuple[int, int]:
  """Ends of train and val among ``n`` stored rows, as tfds slices ``[:a%]``, ``[a%:b%]``.

  tfds (``splits.py``, ``_pct_to_abs_closest``, the default ``rounding="closest"``) maps a
  boundary of ``p`` percent to ``int(round(p * n / 100.0))``; LRA's ``[:80%]``, ``[80%:90%]``,
  ``[90%:]`` are ``fractions=(0.8, 0.1, 0.1)``.

  Args:
    n: rows in the level, empty PNGs included.
    fractions: ``data.split_fractions``; each cumulative boundary must be a whole percent.

  Returns:
    ``(train_end, val_end)``.

  Raises:
    ValueError: naming ``data.split_fractions`` when they are not three non-negative numbers
      summing to 1 whose boundaries are whole percents.
  """
  _split_sizes(n, fractions)   # validates
  pcts = []
  for cumulative in (fractions[0], fractions[0] + fractions[1]):
    pct = round(100.0 * float(cumulative))
    if abs(pct - 100.0 * float(cumulative)) > 1e-6:
      raise ValueError(f"data.split_fractions must cut at whole percents with "
                       f"data.split_hash='lra' (tfds slices by percent), got {tuple(fractions)}")
    pcts.append(pct)
  return int(round(pcts[0] * n / 100.0)), int(round(pcts[1] * n / 100.0))


def _decode(path: str, where: str, resolution: int) -> np.ndarray:
  from PIL import Image, UnidentifiedImageError  # pylint: disable=import-outside-toplevel
  try:
    with Image.open(path) as im:
      im.load()
      if im.size != (resolution, resolution):
        raise ValueError(f"{where}: {path} is {im.size[0]}x{im.size[1]} pixels, expected "
                         f"{resolution}x{resolution} (data.resolution={resolution})")
      if im.mode != "L":
        im = im.convert("L")
      return np.asarray(im, dtype=np.uint8)
  except (UnidentifiedImageError, OSError, SyntaxError) as e:
    raise ValueError(f"{where}: cannot decode {path}: {e}") from None


def load_pathfinder(data_dir: str, *, resolution: int, level: str, seed: int,
                    split_fractions: Sequence[float] = (0.8, 0.1, 0.1),
                    progress: bool = True,
                    split_hash: str = "blake2b") -> dict[str, RaggedExamples]:
  """Reads a Pathfinder level in LRA's layout and splits it into train/val/test.

  Works on the output of :func:`generate_dataset` and on LRA's ``lra_release`` folder (see
  :func:`find_level_dir`). Every metadata row is one example. Rows whose PNG is empty (0
  bytes) are skipped with a warning, as LRA's pipeline filters empty images. The rows are
  ordered by a hash and cut by ``split_fractions`` (LRA: 80/10/10), see the module docstring:
  ``split_hash="blake2b"`` hashes ``(seed, folder, file name)`` and drops empty PNGs before
  cutting; ``split_hash="lra"`` is LRA's tfds order (:func:`lra_order`, seed unused), cut as
  tfds cuts percent slices (:func:`lra_split_bounds`) with empty PNGs counted, which are then
  dropped from each part, as in ``get_pathfinder_base_datasets`` of
  ``lra_benchmarks/image/input_pipeline.py``.

  Args:
    data_dir: a folder holding ``pathfinder{resolution}/{level_dir}`` (or see
      :func:`find_level_dir`).
    resolution: image side in pixels (32 for Pathfinder, 128 for Path-X).
    level: ``easy``, ``intermediate``, ``hard`` or an LRA folder name.
    seed: keys the split hash. Keep it fixed to compare runs on the same test set.
    split_fractions: train, val and test fractions, summing to 1.
    progress: show a tqdm bar while decoding.
    split_hash: ``data.split_hash``, one of :data:`SPLIT_HASHES`.

  Returns:
    ``{"train", "val", "test"}`` -> :class:`RaggedExamples` with uint8 tokens (pixel values
    0..255, each image flattened row-major, ``resolution**2`` tokens), labels 0/1 and
    ``explicit_mask=True``.

  Raises:
    FileNotFoundError: when the level folder or its metadata is missing (naming
      ``data.data_dir``), or a row names a PNG that does not exist (naming the metadata
      file and line).
    ValueError: for a malformed metadata row, an undecodable PNG or one of the wrong size
      (file and line), bad ``split_fractions``, a bad level, or a ``split_hash`` not in
      :data:`SPLIT_HASHES` (naming ``data.split_hash``).
  """
  if split_hash not in SPLIT_HASHES:
    raise ValueError(f"data.split_hash must be one of {SPLIT_HASHES}, got {split_hash!r}")
  fractions = tuple(float(f) for f in split_fractions)
  level_dir = find_level_dir(data_dir, resolution, level)
  rows = read_metadata(level_dir)
  listed, empty = [], 0   # (folder, name, label, where, path, is_empty)
  for folder, name, label, where in rows:
    path = os.path.join(level_dir, folder, name)
    try:
      size = os.path.getsize(path)
    except OSError:
      raise FileNotFoundError(f"{where}: image {path} does not exist (data.data_dir="
                              f"{data_dir!r})") from None
    empty += size == 0
    listed.append((folder, name, label, where, path, size == 0))
  if empty:
    warnings.warn(f"skipped {empty} empty PNG file(s) listed in {level_dir}/metadata "
                  f"(LRA's pipeline drops empty images too)")
  if split_hash == "lra":
    # Empty PNGs count in LRA's percent slices; they are dropped from each slice after.
    order = lra_order([(f, n, int(w.rsplit(":", 1)[1])) for f, n, _, w, *_ in listed], level)
    train_end, val_end = lra_split_bounds(len(listed), fractions)
  else:
    listed = [row for row in listed if not row[-1]]
    keys = [hashlib.blake2b(f"{int(seed)}/{folder}/{name}".encode(), digest_size=8).digest()
            for folder, name, *_ in listed]
    order = sorted(range(len(listed)), key=keys.__getitem__)
    n_train, n_val, _ = _split_sizes(len(listed), fractions)
    train_end, val_end = n_train, n_train + n_val
  parts = {"train": order[:train_end], "val": order[train_end:val_end],
           "test": order[val_end:]}
  parts = {split: [i for i in idx if not listed[i][-1]] for split, idx in parts.items()}
  pixels = resolution * resolution
  total = sum(len(idx) for idx in parts.values())
  bar = tqdm.tqdm(total=total, desc=f"Reading pathfinder{resolution}", unit="img",
                  disable=not progress or total < 5000)
  splits = {}
  try:
    for split, idx in parts.items():
      tokens = np.empty((len(idx), pixels), np.uint8)
      labels = np.empty(len(idx), np.int32)
      for out, i in enumerate(idx):
        _, _, label, where, path, _ = listed[i]
        tokens[out] = _decode(path, where, resolution).reshape(pixels)
        labels[out] = label
        bar.update(1)
      splits[split] = RaggedExamples(
          tokens=tokens.reshape(-1), offsets=np.arange(len(idx) + 1, dtype=np.int64) * pixels,
          labels=labels, explicit_mask=True)
  finally:
    bar.close()
  return splits
