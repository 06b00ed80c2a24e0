"""Drawing one Pathfinder image (Linsley et al., 2018), a pure function of a random state.

This is the ``solid`` generator (``data.generator="solid"``): its paths are connected, so the
label can be read off the pixels. The default, ``dashed``, draws LRA's images by the original's
algorithm (:mod:`simpletron_jax.data.pathfinder.dashed`).

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
rounded. The paddle and marker masks come from a table built once per setting
(:mod:`.draw_masks`).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from simpletron_jax.data.pathfinder.draw_masks import _ANGLES, _Q, _hits, _paint, _table
from simpletron_jax.data.pathfinder.params import PathfinderParams

_START_TRIES = 16
"""Start points drawn per walk; the first on a free pixel is used."""


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
