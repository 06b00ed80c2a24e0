"""Pathfinder's levels and resolutions, and the generators' settings for each (LRA's list).

:func:`dashed_params_for` gives the :class:`DashedParams` of the default ``dashed`` generator
(:mod:`.dashed`) and :func:`params_for` the :class:`PathfinderParams` of the ``solid`` one
(:mod:`.draw`), for one resolution (32: Pathfinder, 128: Path-X) and level (``easy``,
``intermediate``, ``hard``), from the numbers LRA lists for the original generator
(``drewlinsley/pathfinder``) in ``lra_benchmarks/data/pathfinder.py``.
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


GENERATORS = ("dashed", "solid")
"""Values of ``data.generator``: ``dashed`` draws LRA's images (the algorithm of
``drewlinsley/pathfinder``, :mod:`.dashed`), ``solid`` the connected paths of :mod:`.draw`."""


def check_generator(generator: str) -> str:
  """Returns ``generator`` when it is one of :data:`GENERATORS`.

  Raises:
    ValueError: naming ``data.generator`` otherwise.
  """
  if generator not in GENERATORS:
    raise ValueError(f"data.generator must be one of {GENERATORS}, got {generator!r}")
  return generator


@dataclasses.dataclass(frozen=True)
class DashedParams:
  """Settings of the dashed generator (:mod:`.dashed`) for one resolution and level.

  The names and defaults follow ``snakes2_wrapper.py`` of ``drewlinsley/pathfinder`` (its
  ``Args``), with LRA's values from ``lra_benchmarks/data/pathfinder.py``. Lengths are in output
  pixels.

  Attributes:
    resolution: image height and width (``window_size``).
    contour_length: paddles in each of the two target contours.
    distractor_length: paddles per distractor contour (``contour_length // 3``).
    num_distractors: distractor contours tried (``num_distractor_snakes``); one that still
      fails after ``distractor_tries`` attempts is left out, as in the original.
    paddle_length: paddle length (an int: paddle ends are whole pixels).
    paddle_thickness: stroke width; ``paddle_thickness * antialias_scale`` must be whole.
    paddle_margins: the margin choices (``paddle_margin_list``); each image draws one. It sets
      the gap between paddles (about ``2 * margin``), the clearance kept around paddles, and
      the radius of the circle on which the next paddle is chosen (``paddle_length + margin``).
    padding: width of the frame along the border that counts as occupied.
    antialias_scale: strokes and markers are drawn this many times larger, then shrunk with
      a Lanczos filter.
    seed_distance: distance between the starts of the two target contours; the first start
      is at least ``2 * seed_distance`` from the border.
    marker_radius: marker disc radius.
    continuity: the turn between paddles is weighted ``cos(min(continuity * turn, 90 deg))**2``
      (so turns over ``90 / continuity`` degrees are never taken).
    target_contrast: intensity of target paddles (``snake_contrast_list`` times
      ``paddle_contrast_list``, single-valued in LRA).
    distractor_contrast: intensity of distractor paddles (``snake_contrast_list``).
    marker_contrast: intensity of the markers (1 in the original). The image is scaled so
      that its brightest pixel is 255, so only the ratios of the three matter.
    seed_tries, paddle_tries, distractor_tries: draws per first paddle, per paddle and per
      distractor contour (``max_paddle_retrial + 1``, ``max_paddle_retrial + 1``,
      ``max_distractor_contour_retrial + 1``).
    max_scene_attempts: the original redraws the two target contours until they succeed,
      without limit; here an image that needs more attempts raises an error.
  """

  resolution: int
  contour_length: int
  distractor_length: int
  num_distractors: int
  paddle_length: int
  paddle_thickness: float
  paddle_margins: tuple[int, ...]
  padding: int
  antialias_scale: int
  seed_distance: int
  marker_radius: float
  continuity: float
  target_contrast: float
  distractor_contrast: float
  marker_contrast: float = 1.0
  seed_tries: int = 3
  paddle_tries: int = 3
  distractor_tries: int = 5
  max_scene_attempts: int = 10000

  def __post_init__(self):
    ints = ("resolution", "contour_length", "distractor_length", "paddle_length",
            "antialias_scale", "seed_tries", "paddle_tries", "distractor_tries",
            "max_scene_attempts")
    for name in ints:
      value = getattr(self, name)
      if int(value) != value or value < 1:
        raise ValueError(f"DashedParams.{name} must be an int >= 1, got {value!r}")
    if self.num_distractors < 0 or self.padding < 0 or self.seed_distance < 1:
      raise ValueError("DashedParams: num_distractors and padding must be >= 0 and "
                       "seed_distance >= 1")
    if not self.paddle_margins or min(self.paddle_margins) < 1:
      raise ValueError(f"DashedParams.paddle_margins must be ints >= 1, got "
                       f"{self.paddle_margins}")
    scaled = self.paddle_thickness * self.antialias_scale
    if self.paddle_thickness <= 0 or round(scaled) != scaled:
      raise ValueError(f"DashedParams: paddle_thickness * antialias_scale must be a whole "
                       f"number > 0, got {self.paddle_thickness} * {self.antialias_scale}")
    if self.marker_radius <= 0 or self.continuity <= 0:
      raise ValueError("DashedParams: marker_radius and continuity must be > 0")
    if min(self.target_contrast, self.distractor_contrast, self.marker_contrast) <= 0:
      raise ValueError("DashedParams: contrasts must be > 0")
    if 4 * self.seed_distance >= self.resolution:
      raise ValueError(f"DashedParams: the first contour starts 2 * seed_distance from "
                       f"every border, so 4 * seed_distance must be below the resolution "
                       f"{self.resolution}, got seed_distance={self.seed_distance}")


def dashed_params_for(resolution: int, level: str) -> DashedParams:
  """The dashed generator's settings for one LRA resolution and level.

  LRA's builders (``Pathfinder32``, ``Pathfinder128`` in ``lra_benchmarks/data/pathfinder.py``)
  list what they changed in ``snakes2_wrapper.py``; the rest is that wrapper's
  (``use_single_paddles=False``, ``max_paddle_retrial=2``, ``max_distractor_contour_retrial=4``,
  ``paddle_length=5``, ``paddle_contrast_list=[1.]``) and its levels ``curv_baseline``,
  ``curv_contour_length_9`` and ``curv_contour_length_14`` (6, 9 and 14 paddles, distractors of
  ``contour_length // 3``):

  * 32x32: margin 1, padding 1, paddle length 2, marker radius 1.5, thickness 0.5,
    antialiasing 2, seed distance 7, continuity 1.0, ``20 // distractor_length`` distractors,
    ``snake_contrast_list=[2]``, ``paddle_contrast_list=[0.75]`` (targets 1.5, distractors 2).
  * 128x128 (Path-X): margins 2 or 3, padding 1, paddle length 5 (the wrapper's), seed
    distance 20, marker radius 3, thickness 1.5, antialiasing 2, continuity 1.8,
    ``35 // distractor_length`` distractors (LRA writes ``35 / (14 / 3)``, which only runs
    with Python 2's integer division), ``snake_contrast_list=[0.9]``.

  Args:
    resolution: 32 or 128.
    level: ``easy``, ``intermediate``, ``hard``, or the folder names in :data:`LEVELS`.

  Returns:
    The frozen settings.

  Raises:
    ValueError: for another resolution or level, naming ``data.resolution`` or ``data.level``.
  """
  contour = CONTOUR_LENGTHS[_level_name(level)]
  distractor = contour // 3
  if resolution == 32:
    return DashedParams(resolution=32, contour_length=contour, distractor_length=distractor,
                        num_distractors=20 // distractor, paddle_length=2,
                        paddle_thickness=0.5, paddle_margins=(1,), padding=1,
                        antialias_scale=2, seed_distance=7, marker_radius=1.5,
                        continuity=1.0, target_contrast=2 * 0.75, distractor_contrast=2.0)
  if resolution == 128:
    return DashedParams(resolution=128, contour_length=contour, distractor_length=distractor,
                        num_distractors=35 // distractor, paddle_length=5,
                        paddle_thickness=1.5, paddle_margins=(2, 3), padding=1,
                        antialias_scale=2, seed_distance=20, marker_radius=3.0,
                        continuity=1.8, target_contrast=0.9, distractor_contrast=0.9)
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
