"""What the dashed generator (:mod:`.dashed`) keeps from image to image: paddles and candidates.

A *paddle* of length ``L`` runs from a whole pixel along an angle: a line of width
``thickness * s`` drawn with PIL on an ``s``-times larger patch (``s`` the antialiasing scale)
and shrunk with PIL's Lanczos filter; its *mask* is that line dilated by a disc of radius
``margin * s``, shrunk the same way. :class:`_Paddles` makes and keeps these patches, and the
first-paddle kernels read off their masks, for one ``(length, thickness, margin, scale)``.
:class:`_Geometry` holds the rest that depends on the settings and the margin only: the padded
empty image, the pixels on the next paddle's circle with their angles and discs, the weights
after each turn (:class:`_Turn`), and the first-paddle free-pixel tests, OpenCV's border effect
included. All of it follows ``snakes2.py`` of ``drewlinsley/pathfinder`` (Linsley et al., 2018),
written anew from that code; the module docstring of :mod:`.dashed` gives the algorithm.

The names are private to :mod:`simpletron_jax.data.pathfinder`; :mod:`.dashed` draws with them.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from simpletron_jax.data.pathfinder.params import DashedParams

_FREE = 0.3
"""A pixel whose occupied mask is at most this counts as free (``np.ceil(mask - 0.3) == 0``)."""


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
