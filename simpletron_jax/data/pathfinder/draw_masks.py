"""The masks of the solid generator (:mod:`.draw`): every paddle and the marker disc, per setting.

Path vertices lie on a lattice of ``1/_Q`` pixel and headings are whole degrees, so every
paddle's masks come from a table (:func:`_table`) built once per setting: for each heading and
sub-pixel start, the lit sub-samples at the antialiasing scale (``[width * s, width * s]``
bool) and the lit pixels. While a scene is drawn, the pixels that a new path may not light are
kept as one Python int per row (bit ``c`` = column ``c``, :data:`_Rows`), which makes the many
small collision tests (:func:`_hits`) and claims (:func:`_paint`) cheap.

The generator is written from Linsley et al. (2018) and LRA's parameter list
(``lra_benchmarks/data/pathfinder.py``), not from the original code. The names are private to
:mod:`simpletron_jax.data.pathfinder`; :mod:`.draw` draws with them.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

_Q = 8
"""Lattice points per pixel for path vertices."""
_ANGLES = 360
"""Heading resolution: one degree."""

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
  """Builds the masks for one setting (cached per process)."""
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
