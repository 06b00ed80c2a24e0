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
image (OpenCV's border value, see :meth:`_Geometry.reads_outside`); at 32 x 32 that rules out
330 of the 360 angles, and here too. The two
target contours start ``seed_distance`` apart: the first tail is drawn as above with a frame of
``2 * seed_distance`` pixels, the second at a random whole-degree angle ``seed_distance`` from it
(rounded), unchecked. The two targets then grow one paddle each in turn; if either gets stuck,
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
import functools
import math
from typing import Any

import numpy as np

from simpletron_jax.data.pathfinder.params import DashedParams

_COLLISION = 1.8
"""A new paddle's mask plus the occupied mask must stay below this (``extend_snake``)."""
_FREE = 0.3
"""A pixel whose occupied mask is at most this counts as free (``np.ceil(mask - 0.3) == 0``)."""
_MIN_FREE_FRACTION = 0.01
"""A distractor's first paddle is refused when less of the image is free
(``stop_with_availability``)."""
_MIN_MASS = 1e-4
"""A next paddle is refused when the weights of the circle's pixels sum to less."""


def _translate(y: float, x: float, angle: float, dist: float) -> tuple[int, int]:
  """``(y, x)`` moved by ``dist`` pixels along ``angle`` (radians; 0 is +x, pi/2 is +y),
  each coordinate rounded up to a whole pixel, as the original's ``translate_coord``."""
  return math.ceil(y + dist * math.sin(angle)), math.ceil(x + dist * math.cos(angle))


def _flip(angle: float) -> float:
  """``angle`` turned by pi, kept in ``[-pi, pi)`` (the original's ``flip_by_pi``)."""
  return angle + math.pi if angle < 0 else angle - math.pi


def _disc_offsets(radius: int) -> tuple[np.ndarray, np.ndarray]:
  """Row and column offsets of the disc ``dy**2 + dx**2 <= radius**2`` (int64 arrays)."""
  d = np.arange(-radius, radius + 1)
  dy, dx = np.nonzero(d[:, None] ** 2 + d[None, :] ** 2 <= radius * radius)
  return dy - radius, dx - radius


def _lanczos_shrink(image_u8: np.ndarray, size: int) -> np.ndarray:
  """A square uint8 image resized to ``size x size`` with PIL's Lanczos filter, as float32 / 255."""
  from PIL import Image  # pylint: disable=import-outside-toplevel
  out = Image.fromarray(np.ascontiguousarray(image_u8, np.uint8)).resize(
      (size, size), Image.Resampling.LANCZOS)
  return np.asarray(out, dtype=np.float32) / np.float32(255.0)


class _Paddles:
  """Paddle patches and first-paddle kernels for one ``(length, thickness, margin, scale)``.

  A patch is ``size x size`` pixels (``size = 2 * reach + 1``, ``reach = length +
  ceil(thickness) + margin``) with the paddle's start on its centre pixel. Patches are made on
  first use and kept (there are 360 first-paddle angles and a few dozen next-paddle ones).
  """

  def __init__(self, length: int, thickness: float, margin: int, scale: int):
    self.length, self.margin, self.scale = int(length), int(margin), int(scale)
    self.width = int(round(thickness * scale))
    self.reach = self.length + math.ceil(thickness) + self.margin
    self.size = 2 * self.reach + 1
    self._blown_disc = _disc_offsets(self.margin * self.scale)
    self._patches: dict[float, tuple[np.ndarray, np.ndarray]] = {}
    self._kernels: dict[int, tuple[np.ndarray, np.ndarray]] = {}

  def patch(self, angle: float) -> tuple[np.ndarray, np.ndarray]:
    """``(line, mask)``: float32 ``[size, size]`` in [0, 1] for a paddle along ``angle``."""
    found = self._patches.get(angle)
    if found is not None:
      return found
    from PIL import Image, ImageDraw  # pylint: disable=import-outside-toplevel
    s, blown = self.scale, 2 * self.reach * self.scale + 1
    centre = self.reach * s
    head_y, head_x = _translate(centre, centre, angle, self.length * s)
    canvas = Image.new("L", (blown, blown), 0)
    ImageDraw.Draw(canvas).line([(centre, centre), (head_x, head_y)], fill=255,
                                width=self.width)
    lit = np.asarray(canvas) > 0
    # The mask: the line dilated by a disc of margin * scale (on the large patch).
    grown = np.zeros((3 * blown, 3 * blown), bool)
    dy, dx = self._blown_disc
    for a, b in zip(dy.tolist(), dx.tolist()):
      grown[blown + a:2 * blown + a, blown + b:2 * blown + b] |= lit
    grown = grown[blown:2 * blown, blown:2 * blown]
    line = _lanczos_shrink(np.asarray(canvas), self.size)
    mask = _lanczos_shrink(grown.astype(np.uint8) * np.uint8(255), self.size)
    line.setflags(write=False)
    mask.setflags(write=False)
    self._patches[angle] = (line, mask)
    return line, mask

  def kernel(self, degree: int) -> tuple[np.ndarray, np.ndarray]:
    """Offsets ``(dy, dx)`` from a tail that a first paddle at ``degree`` must find free.

    The original dilates the occupied mask by the saturated part (value 1) of the paddle's
    mask drawn in a ``2 * (length + margin) + 1`` square from one pixel below and right of its
    centre (OpenCV's ``dilate`` reads ``src(p + k - anchor)``); cells of the patch outside that
    square are cut off.
    """
    found = self._kernels.get(degree)
    if found is not None:
      return found
    _, mask = self.patch(degree * np.pi / 180)
    half = self.length + self.margin                  # the square's centre (the anchor)
    rows, cols = np.nonzero(mask == 1.0)
    square_r = half + 1 - self.reach + rows           # patch cell -> square cell
    square_c = half + 1 - self.reach + cols
    keep = (square_r >= 0) & (square_r <= 2 * half) & (square_c >= 0) & (square_c <= 2 * half)
    found = (square_r[keep] - half, square_c[keep] - half)
    self._kernels[degree] = found
    return found


@functools.lru_cache(maxsize=16)
def _paddles(length: int, thickness: float, margin: int, scale: int) -> _Paddles:
  return _Paddles(length, thickness, margin, scale)


@dataclasses.dataclass(frozen=True)
class _Turn:
  """The candidates with a weight above 0 after a paddle at one angle: their indices into
  :class:`_Geometry`'s candidates (in its order), weights, flat occupied-mask offsets of the disc
  around each (``[n, disc]``) and pixel offsets; a pivot ``(y, x)`` with ``rows[0] <= y <
  rows[1]`` and ``cols[0] <= x < cols[1]`` has all of them inside the image. Candidates of
  weight 0 can never be drawn, so leaving them out changes no draw."""

  index: np.ndarray
  weight: np.ndarray
  disc: np.ndarray
  dy: np.ndarray
  dx: np.ndarray
  rows: tuple[int, int]
  cols: tuple[int, int]


class _Geometry:
  """Everything about one ``(params, margin)`` that does not change from image to image.

  Images are float64 ``[H + 2B, H + 2B]`` arrays with the picture at ``[B:B + H, B:B + H]``
  (``B = reach + 2``). The next paddle's circle has radius ``length + margin`` and one sample
  per pixel of arc; truncated to whole pixels around a whole-pixel pivot, its samples give a
  fixed list of distinct offsets (``cand_dy``, ``cand_dx``, in the row-major order of
  ``np.unique``) whose angles seen from the pivot (``cand_angle``) do not depend on the pivot.
  """

  def __init__(self, p: DashedParams, margin: int):
    self.p, self.margin, self.h = p, margin, p.resolution
    self.pad = _paddles(p.paddle_length, p.paddle_thickness, margin, p.antialias_scale)
    self.border = b = self.pad.reach + 2
    self.width = w = self.h + 2 * b
    self.template = np.zeros((w, w))
    inner = self.template[b:b + self.h, b:b + self.h]
    if p.padding:
      f = p.padding
      inner[:f] = inner[-f:] = 1.0
      inner[:, :f] = inner[:, -f:] = 1.0
    radius = p.paddle_length + margin
    self.step = p.paddle_length + 2 * margin
    theta = np.arange(0, 360, 360.0 / (2 * radius * np.pi)) * np.pi / 180
    offsets = np.unique(np.stack([np.floor(radius * np.sin(theta)),
                                  np.floor(radius * np.cos(theta))], 1).astype(np.int64), axis=0)
    self.cand_dy, self.cand_dx = offsets[:, 0], offsets[:, 1]
    self.cand_angle = np.arctan2(self.cand_dy, self.cand_dx)
    ddy, ddx = _disc_offsets(margin)
    self.cand_disc = ((self.cand_dy[:, None] + ddy[None, :]) * w
                      + self.cand_dx[:, None] + ddx[None, :])
    self.cand_back = [_flip(float(a)) for a in self.cand_angle]
    self.cand_patch = [self.pad.patch(a) for a in self.cand_back]
    self.cand_angle_list = self.cand_angle.tolist()
    self.cand_dy_list, self.cand_dx_list = self.cand_dy.tolist(), self.cand_dx.tolist()
    self._turns: dict[float, _Turn] = {}
    self._outside: dict[int, bool] = {}
    self._first_target: dict[int, tuple[np.ndarray, np.ndarray]] = {}

  def turn(self, angle: float) -> _Turn:
    """The candidates a paddle at ``angle`` may turn to (see :class:`_Turn`)."""
    found = self._turns.get(angle)
    if found is None:
      turn = np.abs(self.cand_angle - angle)
      turn = np.minimum(np.minimum(turn, 2 * np.pi - turn) * self.p.continuity, 0.5 * np.pi)
      weight = np.maximum(np.cos(turn), 0.0) ** 2
      index = np.flatnonzero(weight > 0)
      dy, dx = self.cand_dy[index], self.cand_dx[index]
      found = self._turns[angle] = _Turn(
          index=index, weight=weight[index], disc=self.cand_disc[index], dy=dy, dx=dx,
          rows=(-int(dy.min()), self.h - int(dy.max())),
          cols=(-int(dx.min()), self.h - int(dx.max())))
    return found

  def reads_outside(self, degree: int) -> bool:
    """True when some pixel of the image reads only outside it through
    ``pad.kernel(degree)``.

    OpenCV's ``dilate`` gives such a pixel ``-DBL_MAX`` (its default border for a float
    image), and the original then finds no free pixel at all (``find_available_coordinates``
    returns 0 when the map has a negative value), so the first paddle fails. At 32 x 32 this
    holds for 330 of the 360 angles, whose kernels lie on one side of their anchor.
    """
    found = self._outside.get(degree)
    if found is None:
      b, h = self.border, self.h
      inside = np.zeros((self.width, self.width), bool)
      inside[b:b + h, b:b + h] = True
      # free_tails_map(degree, inside) marks the pixels none of whose reads is inside.
      found = self._outside[degree] = bool(self.free_tails_map(degree, inside).any())
    return found

  def free_tails_map(self, degree: int, blocked: np.ndarray) -> np.ndarray:
    """Bool ``[H, H]``: tails whose kernel (``pad.kernel(degree)``) meets no ``blocked`` cell
    (``blocked`` is ``[W, W]``, padded like the scene)."""
    b, h = self.border, self.h
    hit = np.zeros((h, h), bool)
    dy, dx = self.pad.kernel(degree)
    for a, c in zip((dy + b).tolist(), (dx + b).tolist()):
      np.logical_or(hit, blocked[a:a + h, c:c + h], out=hit)
    return ~hit

  def blocked(self, mask: np.ndarray, frame: int) -> np.ndarray:
    """Cells above 0.3 (``np.ceil(mask - 0.3) > 0``), with ``frame`` pixels of border."""
    b, h = self.border, self.h
    out = mask > _FREE
    inner = out[b:b + h, b:b + h]
    inner[:frame] = inner[-frame:] = True
    inner[:, :frame] = inner[:, -frame:] = True
    return out

  def first_target_tails(self, degree: int) -> tuple[np.ndarray, np.ndarray]:
    """Free tails of the first target's first paddle: the mask is still empty then, so they
    depend on the angle only (a ``2 * seed_distance`` frame)."""
    found = self._first_target.get(degree)
    if found is None:
      blocked = self.blocked(self.template, 2 * self.p.seed_distance)
      found = self._first_target[degree] = np.nonzero(self.free_tails_map(degree, blocked))
    return found


@functools.lru_cache(maxsize=32)
def _geometry(p: DashedParams, margin: int) -> _Geometry:
  return _Geometry(p, margin)


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
      ``(turn, pmf)``: the :class:`_Turn` of ``angle`` and the normalised float64 weights of
      its candidates (0 for those outside the image); None when the weights sum below 1e-4
      (which includes a circle wholly outside the image).
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
