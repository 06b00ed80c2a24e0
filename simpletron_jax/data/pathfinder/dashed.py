"""Pathfinder as LRA drew it: dashed contours, by the algorithm of Linsley et al.'s generator.

LRA's Pathfinder-32 and Path-X images were made by ``snakes2.py`` of ``drewlinsley/pathfinder``
(run by its ``snakes2_wrapper.py`` with the settings listed in
``lra_benchmarks/data/pathfinder.py``). This module draws images by the same algorithm, written
anew from that code; :func:`simpletron_jax.data.pathfinder.params.dashed_params_for` holds the
settings. A contour is a chain of short straight *paddles* with gaps between them, so the pixels
of one contour are not connected and the label cannot be read off with a connected-component
labelling (the ``solid`` generator of :mod:`.draw` joins its paddles instead).

**Paddles.** A paddle of length ``L`` runs from a whole pixel ``p`` along an angle ``a``: it is a
line of width ``thickness * s`` drawn with PIL on an ``s``-times larger patch (``s`` the
antialiasing scale) and shrunk with PIL's Lanczos filter. Its *mask* is that line dilated by a
disc of radius ``margin * s``, shrunk the same way; masks keep paddles apart. Every move
``q = p + d * (sin a, cos a)`` is rounded up (``ceil``) to whole pixels, as in the original.
The patches, and all else that depends on the settings and the margin only, are made once in
:mod:`.dashed_geometry`.

**A contour** starts with a first paddle at a *tail* ``t`` and angle ``a`` and keeps a *pivot*
``t - margin * u(a)``. Each next paddle is chosen on a circle of radius ``L + margin`` around the
new pivot ``pivot + (L + 2 margin) * u(a)`` (which lies ``margin`` beyond the last paddle's end):
the circle's pixels (one sample per pixel of arc, truncated to whole pixels, duplicates and
those outside the image dropped) are weighted by ``cos(min(continuity * turn, 90 deg))**2`` times
one minus the occupied mask (dilated by a disc of radius ``margin``) at that pixel, and one is
drawn. The paddle runs from that pixel back towards the pivot, so it starts ``margin`` past the
pivot: consecutive paddles are separated by a gap of about ``2 * margin``. A drawn paddle is kept
if its mask plus the occupied mask stays below 1.8 everywhere, else another pixel is drawn (3
draws). The occupied mask holds every earlier paddle's mask except the contour's own last one,
and a frame of ``padding`` pixels.

**First paddles.** A first paddle's angle is a whole degree in ``[-180, 180)``; its tail is drawn
uniformly among the pixels where the saturated part of its mask (shifted by one pixel down and
right, as the original's dilation kernel is) meets no pixel above 0.3 of the occupied mask, a
one-pixel frame included (3 draws of the angle when the paddle would leave the image). The
original finds no free pixel at all when some pixel of that dilation reads only outside the
image (OpenCV's border value, see :meth:`.dashed_geometry._Geometry.reads_outside`); at
32 x 32 that rules out 330 of the 360 angles, and here too. The two target contours start
``seed_distance`` apart: the first tail is drawn as above with a frame of ``2 * seed_distance``
pixels, the second at a random whole-degree angle ``seed_distance`` from it (rounded),
unchecked. The two targets then grow one paddle each in turn; if either gets stuck,
both are drawn again. The occupied mask then gains the last mask of target 1 only (the
original's).

**Distractors.** ``num_distractors`` contours of ``distractor_length`` paddles, each given
``distractor_tries`` attempts; a contour that fails is left out. A first paddle is refused when
less than 1% of the image is free.

**Label and markers.** The label is a fair coin, drawn first; the scene does not depend on it.
One target is chosen at random; the first marker goes on its tail. The second goes on the far
end of its last paddle (label 1) or of the other target's last paddle (label 0). A marker is a
disc of radius ``marker_radius`` centred on the top-left corner of its pixel, drawn at the
antialiasing scale over the whole image and shrunk with Lanczos.

**Intensities.** Target paddles have intensity ``target_contrast``, distractors
``distractor_contrast``, markers ``marker_contrast``; overlaps take the maximum. The image is
then scaled to 0..255 between its smallest and largest value and rounded (``scipy.misc.imsave``,
which the original called, did this), so the brightest pixel is 255.

The original is unseeded and draws with NumPy's global state; here every image is a pure
function of a :class:`numpy.random.Generator` (see :func:`dashed_example_rng`).
``benchmarks/pathfinder_generators.py`` compares this module's images with the original's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from simpletron_jax.data.pathfinder.dashed_geometry import (_FREE, _Geometry, _flip, _geometry,
                                                            _lanczos_shrink, _translate)
from simpletron_jax.data.pathfinder.params import DashedParams

_COLLISION = 1.8
"""A new paddle's mask plus the occupied mask must stay below this (``extend_snake``)."""
_MIN_FREE_FRACTION = 0.01
"""A distractor's first paddle is refused when less of the image is free
(``stop_with_availability``)."""
_MIN_MASS = 1e-4
"""A next paddle is refused when the weights of the circle's pixels sum to less."""


@dataclasses.dataclass
class _Contour:
  """A contour being drawn: its pivot and angle, its last paddle's mask placement, its ends and
  its paddles as ``(y0, x0, y1, x1)`` in drawing order (floats, pixels)."""

  pivot: tuple[int, int]
  angle: float
  last: tuple[int, int, np.ndarray]
  tail: tuple[int, int]
  tip: tuple[int, int]
  paddles: list[tuple[float, float, float, float]]


class _Scene:
  """One image while it is drawn: the occupied mask and the intensity canvas.

  Both are padded as in :class:`_Geometry`. The border stays 0 in the mask (the original clips
  every patch to the image, and OpenCV's dilation ignores what lies outside), so a patch needs
  no clipping when it is read.
  """

  def __init__(self, g: _Geometry, rng: np.random.Generator):
    self.g, self.p, self.rng = g, g.p, rng
    self.h, self.border, self.reach = g.h, g.border, g.pad.reach
    self.mask = g.template.copy()
    self.flat = self.mask.reshape(-1)
    self.strokes: list[tuple[int, int, np.ndarray, float]] = []

  def occupy(self, y: int, x: int, mask_patch: np.ndarray) -> None:
    """Adds a paddle's mask (clipped to the image) to the occupied mask."""
    r, b, h = self.reach, self.border, self.h
    r0, r1 = max(y - r, 0), min(y + r, h - 1) + 1
    c0, c1 = max(x - r, 0), min(x + r, h - 1) + 1
    window = self.mask[r0 + b:r1 + b, c0 + b:c1 + b]
    np.maximum(window, mask_patch[r0 - y + r:r1 - y + r, c0 - x + r:c1 - x + r], out=window)

  def render(self) -> np.ndarray:
    """The strokes drawn so far, each line patch times its contrast, overlaps taking the
    maximum: float64 ``[H, H]``."""
    r, b, h = self.reach, self.border, self.h
    image = np.zeros_like(self.mask)
    for y, x, line, contrast in self.strokes:
      window = image[y - r + b:y + r + b + 1, x - r + b:x + r + b + 1]
      np.maximum(window, line * np.float32(contrast), out=window)
    return image[b:b + h, b:b + h]

  def inside(self, *points: tuple[int, int]) -> bool:
    return all(0 <= y < self.h and 0 <= x < self.h for y, x in points)

  # -- first paddles ------------------------------------------------------------------------
  def _first_paddle(self, target: bool) -> tuple[tuple[int, int], float, tuple[int, int]] | None:
    """Draws a first paddle's tail, angle and pivot (``seed_snake`` or the first half of
    ``initialize_two_seeds``); None when it fails."""
    g, p, rng = self.g, self.p, self.rng
    length, margin = p.paddle_length, g.margin
    blocked = None
    for _ in range(p.seed_tries):
      degree = int(rng.integers(-180, 180))
      angle = degree * np.pi / 180
      if g.reads_outside(degree):
        return None
      if target:
        rows, cols = g.first_target_tails(degree)
      else:
        if blocked is None:
          blocked = g.blocked(self.mask, 1)
        rows, cols = np.nonzero(g.free_tails_map(degree, blocked))
      if len(rows) == 0:
        return None
      k = int(rng.integers(len(rows)))
      tail = (int(rows[k]), int(cols[k]))
      head = _translate(*tail, angle, length)
      pivot = _translate(*head, _flip(angle), length + margin)
      if self.inside(head, pivot):
        return tail, angle, pivot
    return None

  def _start(self, tail, angle, pivot, contrast) -> _Contour:
    line, mask = self.g.pad.patch(angle)
    self.strokes.append((tail[0], tail[1], line, contrast))
    length = self.p.paddle_length
    end = (tail[0] + length * math.sin(angle), tail[1] + length * math.cos(angle))
    return _Contour(pivot=pivot, angle=angle, last=(tail[0], tail[1], mask), tail=tail,
                    tip=tail, paddles=[(float(tail[0]), float(tail[1])) + end])

  def start_contour(self, contrast: float) -> _Contour | None:
    """A distractor's first paddle (``seed_snake`` with ``stop_with_availability=0.01``)."""
    b, h = self.border, self.h
    free = np.count_nonzero(self.mask[b:b + h, b:b + h] <= _FREE)
    if free / (h * h) < _MIN_FREE_FRACTION:
      return None
    first = self._first_paddle(target=False)
    return None if first is None else self._start(*first, contrast)

  def start_targets(self, contrast: float) -> tuple[_Contour, _Contour] | None:
    """The two targets' first paddles, ``seed_distance`` apart (``initialize_two_seeds``)."""
    p, rng = self.p, self.rng
    first = self._first_paddle(target=True)
    if first is None:
      return None
    tail1 = first[0]
    length, margin = p.paddle_length, self.g.margin
    for _ in range(p.seed_tries):
      angle = int(rng.integers(-180, 180)) * np.pi / 180
      towards = int(rng.integers(0, 360)) * np.pi / 180
      tail2 = (int(round(tail1[0] + p.seed_distance * math.sin(towards))),
               int(round(tail1[1] + p.seed_distance * math.cos(towards))))
      head = _translate(*tail2, angle, length)
      pivot = _translate(*head, _flip(angle), length + margin)
      if self.inside(head, pivot):
        break
    else:
      return None
    return self._start(*first, contrast), self._start(tail2, angle, pivot, contrast)

  # -- next paddles -------------------------------------------------------------------------
  def candidates(self, pivot: tuple[int, int], angle: float):
    """The pixels a next paddle may end on, around ``pivot``, after a paddle at ``angle``
    (``get_coords_cmf``).

    Returns:
      ``(turn, pmf)``: the :class:`.dashed_geometry._Turn` of ``angle`` and the normalised
      float64 weights of its candidates (0 for those outside the image); None when the weights
      sum below 1e-4 (which includes a circle wholly outside the image).
    """
    t, h, b, py, px = self.g.turn(angle), self.h, self.border, pivot[0], pivot[1]
    base = (py + b) * self.g.width + px + b
    if t.rows[0] <= py < t.rows[1] and t.cols[0] <= px < t.cols[1]:
      pmf = (1.0 - self.flat.take(t.disc + base).max(axis=1)) * t.weight
    else:
      cy, cx = py + t.dy, px + t.dx
      keep = (cy >= 0) & (cy < h) & (cx >= 0) & (cx < h)
      near = self.flat.take(t.disc + base, mode="clip").max(axis=1)
      pmf = (1.0 - near) * t.weight * keep
    total = float(pmf.sum())
    if total < _MIN_MASS:
      return None
    return t, pmf / total

  def extend(self, c: _Contour, contrast: float) -> bool:
    """Adds one paddle to ``c`` (``extend_snake``); False when none fits (``c`` unchanged)."""
    g, rng, r, b, h = self.g, self.rng, self.reach, self.border, self.h
    step = g.step
    py = math.ceil(c.pivot[0] + step * math.sin(c.angle))
    px = math.ceil(c.pivot[1] + step * math.cos(c.angle))
    found = self.candidates((py, px), c.angle)
    if found is None:
      return False
    turn, pmf = found
    cmf = np.cumsum(pmf)
    for _ in range(self.p.paddle_tries):
      k = int(np.searchsorted(cmf, rng.random(), side="right"))
      if k < len(cmf):
        k = int(turn.index[k])
      else:   # the draw fell above the rounded total: the original then takes its pixel 0
        k = next(j for j in range(len(g.cand_dy_list))
                 if 0 <= py + g.cand_dy_list[j] < h and 0 <= px + g.cand_dx_list[j] < h)
      y, x = py + g.cand_dy_list[k], px + g.cand_dx_list[k]
      line, mask = g.cand_patch[k]
      window = self.mask[y - r + b:y + r + b + 1, x - r + b:x + r + b + 1]
      if float((window + mask).max()) < _COLLISION:
        break
    else:
      return False
    self.strokes.append((y, x, line, contrast))
    self.occupy(*c.last)
    back, length = g.cand_back[k], self.p.paddle_length
    c.paddles.append((y + length * math.sin(back), x + length * math.cos(back),
                      float(y), float(x)))
    c.pivot, c.angle, c.last, c.tip = (py, px), g.cand_angle_list[k], (y, x, mask), (y, x)
    return True

  def snapshot(self) -> tuple[np.ndarray, int]:
    return self.mask.copy(), len(self.strokes)

  def restore(self, saved: tuple[np.ndarray, int]) -> None:
    self.mask = saved[0]
    self.flat = self.mask.reshape(-1)
    del self.strokes[saved[1]:]


def _targets(g: _Geometry, rng: np.random.Generator):
  """Draws the two target contours on a fresh scene (``two_snakes``); None when stuck."""
  p = g.p
  scene = _Scene(g, rng)
  pair = scene.start_targets(p.target_contrast)
  if pair is None:
    return None
  for _ in range(p.contour_length - 1):
    for contour in pair:
      if not scene.extend(contour, p.target_contrast):
        return None
  scene.occupy(*pair[1].last)   # the original adds target 1's last mask only
  return scene, pair


def _distractor(scene: _Scene) -> _Contour | None:
  """One distractor contour (``make_snake``); the scene is unchanged when it fails."""
  p = scene.p
  saved = scene.snapshot()
  contour = scene.start_contour(p.distractor_contrast)
  if contour is not None:
    for _ in range(p.distractor_length - 1):
      if not scene.extend(contour, p.distractor_contrast):
        contour = None
        break
  if contour is None:
    scene.restore(saved)
    return None
  scene.occupy(*contour.last)
  return contour


def _marker(p: DashedParams, centre: tuple[int, int]) -> np.ndarray:
  """A marker disc around the top-left corner of pixel ``centre``: float32 ``[H, W]``."""
  s, h = p.antialias_scale, p.resolution
  ry = (np.arange(h * s) - centre[0] * s)[:, None]
  rx = (np.arange(h * s) - centre[1] * s)[None, :]
  disc = (ry * ry + rx * rx <= (p.marker_radius * s) ** 2).astype(np.uint8) * np.uint8(255)
  return _lanczos_shrink(disc, h)


def _bytescale(image: np.ndarray) -> np.ndarray:
  """Scales to 0..255 between the smallest and largest value, rounding half up (uint8)."""
  low, high = float(image.min()), float(image.max())
  span = high - low if high > low else 1.0
  return (np.clip((image - low) * (255.0 / span), 0, 255) + 0.5).astype(np.uint8)


def render_dashed_info(rng: np.random.Generator, params: DashedParams,
                       label: int | None = None) -> tuple[np.ndarray, int, dict[str, Any]]:
  """Like :func:`render_dashed`, plus what was drawn.

  Args:
    rng: the random source; it is advanced.
    params: the settings, e.g. ``dashed_params_for(32, "hard")``.
    label: if given, overrides the coin (which is still drawn), so the same ``rng`` state
      gives the same scene with the other label's markers.

  Returns:
    ``(image, label, info)``. ``info`` has ``markers`` (the two marker centre pixels
    ``(row, col)``: the discs are centred on their top-left corners), ``targets`` and
    ``distractors`` (per contour, its paddles as ``(y0, x0, y1, x1)`` in pixels, in drawing
    order, each from its start to its end), ``margin``, ``attempts`` (drawings of the two
    targets, 1 when the first succeeded) and ``num_paddles``.

  Raises:
    RuntimeError: when the targets fail ``params.max_scene_attempts`` times in a row.
  """
  coin = int(rng.integers(2))
  label = coin if label is None else int(label)
  margin = int(params.paddle_margins[int(rng.integers(len(params.paddle_margins)))])
  geometry = _geometry(params, margin)
  for attempt in range(1, params.max_scene_attempts + 1):
    drawn = _targets(geometry, rng)
    if drawn is not None:
      break
  else:
    raise RuntimeError(f"no two target contours in {params.max_scene_attempts} attempts; "
                       f"the settings are too crowded: {params}")
  scene, targets = drawn
  distractors = []
  for _ in range(params.num_distractors):
    for _ in range(params.distractor_tries):
      contour = _distractor(scene)
      if contour is not None:
        distractors.append(contour)
        break
  first = int(rng.integers(2))
  second = first if label else 1 - first
  markers = (targets[first].tail, targets[second].tip)
  image = scene.render()
  discs = np.maximum(_marker(params, markers[0]), _marker(params, markers[1]))
  image = _bytescale(np.maximum(image, discs * np.float32(params.marker_contrast)))
  info = {"markers": markers, "margin": margin, "attempts": attempt,
          "targets": [t.paddles for t in targets],
          "distractors": [d.paddles for d in distractors],
          "num_paddles": sum(len(c.paddles) for c in (*targets, *distractors))}
  return image, label, info


def render_dashed(rng: np.random.Generator, params: DashedParams) -> tuple[np.ndarray, int]:
  """Draws one Pathfinder image as LRA's generator did (see the module docstring).

  Args:
    rng: the random source; it is advanced. The image is a pure function of its state.
    params: the settings, e.g. ``dashed_params_for(128, "hard")``.

  Returns:
    ``(image, label)``: ``image`` is ``[resolution, resolution]`` uint8, ``label`` is 1 when the
    two markers lie on the two ends of one contour, else 0.

  Raises:
    RuntimeError: as :func:`render_dashed_info`.
  """
  image, label, _ = render_dashed_info(rng, params)
  return image, label


def dashed_example_rng(seed: int, params: DashedParams, index: int) -> np.random.Generator:
  """The random source of image ``index`` of a dashed data set, seeded by ``(seed, resolution,
  contour_length, index, 1)``: an image does not depend on how the work is split, and its
  stream differs from the solid generator's (whose key has no fifth entry)."""
  return np.random.default_rng([int(seed), params.resolution, params.contour_length,
                                int(index), 1])
