"""Pathfinder's levels and resolutions, and the generator's settings for each (LRA's list).

:func:`params_for` gives the :class:`PathfinderParams` of one resolution (32: Pathfinder,
128: Path-X) and level (``easy``, ``intermediate``, ``hard``), from the numbers LRA lists for
the original generator (``drewlinsley/pathfinder``) in ``lra_benchmarks/data/pathfinder.py``.
"""

from __future__ import annotations

import dataclasses
import math


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
