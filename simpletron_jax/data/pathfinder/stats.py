"""Measuring a set of Pathfinder images, to compare generators with each other and with LRA's.

Every image is summarised by an :class:`ImageRecord`: its pixels, label and marker pixels, and,
where the drawing is known, its contours as lists of paddles ``(y0, x0, y1, x1)`` (from start
to end, in drawing order). :func:`summarize` turns a list of records into the statistics of
``benchmarks/pathfinder_generators.py``:

* ``lit_fraction``: the share of pixels above 0;
* ``paddles``: paddles per image;
* ``gap_hist`` / ``turn_hist``: the distance in pixels from a paddle's end to the next
  paddle's start, and the absolute turn in degrees between consecutive paddles, as shares per
  bin (:data:`GAP_EDGES`, :data:`TURN_EDGES`);
* ``marker_distance``: the distance in pixels between the two marker pixels, per label;
* ``cc_accuracy``: the share of images whose label a connected-component labelling gets right
  (:func:`connected_label`: 1 when the two marker pixels lie in one 8-connected set of pixels
  above 0);
* ``attempts``: drawings of the target contours per image, where known.

:func:`read_original` reads images of the original generator (``drewlinsley/pathfinder``) in
LRA's layout, with a trace of what was drawn (see there).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Sequence

import numpy as np

Paddle = tuple[float, float, float, float]

GAP_EDGES = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, math.inf)
"""Bin edges of the gap histogram (pixels); the last bin is 8 and more."""
TURN_EDGES = (0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 180.01)
"""Bin edges of the turn histogram (degrees); the last bin is 90 and more."""
TRACE_FILE = "orig_trace.jsonl"
"""The trace :func:`read_original` reads beside a level's ``metadata`` folder."""


@dataclasses.dataclass
class ImageRecord:
  """One image and what is known of its drawing.

  Attributes:
    image: uint8 ``[H, W]``.
    label: 0 or 1.
    markers: the two marker pixels ``((row, col), (row, col))``.
    contours: per contour, its paddles ``(y0, x0, y1, x1)`` in pixels; None when unknown.
    num_paddles: paddles in the image (``sum(len(c) for c in contours)`` when they are known).
    attempts: drawings of the target contours (or of the whole image), None when unknown.
  """

  image: np.ndarray
  label: int
  markers: tuple[tuple[int, int], tuple[int, int]]
  contours: list[list[Paddle]] | None
  num_paddles: int
  attempts: int | None = None


def record_from_info(image: np.ndarray, label: int, info: dict[str, Any]) -> ImageRecord:
  """An :class:`ImageRecord` from a generator's ``(image, label, info)``.

  Works on :func:`~simpletron_jax.data.pathfinder.dashed.render_dashed_info` (its ``targets``
  and ``distractors``) and on :func:`~simpletron_jax.data.pathfinder.draw.render_example_info`
  (no paddles: ``contours`` is None and ``num_paddles`` comes from its path counts).

  Raises:
    KeyError: when ``info`` has neither form.
  """
  markers = tuple(tuple(int(v) for v in m) for m in info["markers"])
  if "targets" in info:
    contours = [list(c) for c in (*info["targets"], *info["distractors"])]
    paddles = sum(len(c) for c in contours)
  else:
    contours = None
    paddles = (2 * info["contour_length"]
               + (info["num_paths"] - 2) * info["distractor_length"])
  return ImageRecord(image=image, label=int(label), markers=markers, contours=contours,
                     num_paddles=int(paddles), attempts=info.get("attempts"))


def connected_label(image: np.ndarray, markers: Sequence[Sequence[int]],
                    threshold: int = 0) -> int:
  """1 when both marker pixels lie in one 8-connected set of pixels above ``threshold``.

  Args:
    image: uint8 ``[H, W]``.
    markers: two ``(row, col)`` pixels.
    threshold: pixels above it count as lit.

  Returns:
    0 or 1 (0 also when a marker pixel is not lit).
  """
  from scipy import ndimage  # pylint: disable=import-outside-toplevel
  components, _ = ndimage.label(image > threshold, structure=np.ones((3, 3), bool))
  (ra, ca), (rb, cb) = markers
  a, b = components[ra, ca], components[rb, cb]
  return int(a != 0 and a == b)


def gaps_and_turns(contours: Sequence[Sequence[Paddle]]) -> tuple[np.ndarray, np.ndarray]:
  """Gaps (pixels, end of one paddle to start of the next) and absolute turns (degrees) of
  every pair of consecutive paddles: two float64 arrays."""
  gaps, turns = [], []
  for contour in contours:
    for (a0, b0, a1, b1), (c0, d0, c1, d1) in zip(contour, contour[1:]):
      gaps.append(math.hypot(c0 - a1, d0 - b1))
      turn = math.degrees(math.atan2(c1 - c0, d1 - d0) - math.atan2(a1 - a0, b1 - b0))
      turns.append(abs((turn + 180.0) % 360.0 - 180.0))
  return np.asarray(gaps, np.float64), np.asarray(turns, np.float64)


def _hist(values: np.ndarray, edges: Sequence[float]) -> list[float]:
  if len(values) == 0:
    return [0.0] * (len(edges) - 1)
  counts, _ = np.histogram(values, bins=np.asarray(edges))
  return (counts / len(values)).round(4).tolist()


def summarize(records: Sequence[ImageRecord]) -> dict[str, Any]:
  """The statistics of a set of images (see the module docstring).

  Returns:
    A JSON-ready dict: ``n``, ``positive_fraction``, ``lit_fraction`` and ``lit_fraction_std``,
    ``mean_intensity`` (mean pixel / 255), ``paddles`` and ``paddles_std``, ``gap_mean``,
    ``gap_hist``, ``turn_mean``, ``turn_hist`` (None without paddles), ``marker_distance``
    (``{"0": mean, "1": mean}``), ``cc_accuracy``, ``cc_joined`` (``{"0", "1"}``: share whose
    markers are connected, per label), ``attempts_mean`` and ``attempts_median`` (None when
    unknown).

  Raises:
    ValueError: for an empty list.
  """
  if not records:
    raise ValueError("no images to summarize")
  lit = np.array([(r.image > 0).mean() for r in records])
  labels = np.array([r.label for r in records])
  joined = np.array([connected_label(r.image, r.markers) for r in records])
  distance = np.array([math.dist(*r.markers) for r in records])
  paddles = np.array([r.num_paddles for r in records], np.float64)
  out: dict[str, Any] = {
      "n": len(records), "positive_fraction": round(float(labels.mean()), 4),
      "lit_fraction": round(float(lit.mean()), 4),
      "lit_fraction_std": round(float(lit.std()), 4),
      "mean_intensity": round(float(np.mean([r.image.mean() for r in records]) / 255), 4),
      "paddles": round(float(paddles.mean()), 2), "paddles_std": round(float(paddles.std()), 2),
      "marker_distance": {str(k): (round(float(distance[labels == k].mean()), 2)
                                   if (labels == k).any() else None) for k in (0, 1)},
      "cc_accuracy": round(float((joined == labels).mean()), 4),
      "cc_joined": {str(k): (round(float(joined[labels == k].mean()), 4)
                             if (labels == k).any() else None) for k in (0, 1)},
  }
  if all(r.contours is not None for r in records):
    gaps, turns = gaps_and_turns([c for r in records for c in r.contours])
    out.update(gap_mean=round(float(gaps.mean()), 3), gap_hist=_hist(gaps, GAP_EDGES),
               turn_mean=round(float(turns.mean()), 2), turn_hist=_hist(turns, TURN_EDGES))
  else:
    out.update(gap_mean=None, gap_hist=None, turn_mean=None, turn_hist=None)
  attempts = [r.attempts for r in records]
  if all(a is not None for a in attempts):
    out.update(attempts_mean=round(float(np.mean(attempts)), 1),
               attempts_median=float(np.median(attempts)))
  else:
    out.update(attempts_mean=None, attempts_median=None)
  return out


def total_variation(p: Sequence[float], q: Sequence[float]) -> float:
  """Half the L1 distance between two histograms of shares (0: equal, 1: disjoint)."""
  return 0.5 * float(np.abs(np.asarray(p, np.float64) - np.asarray(q, np.float64)).sum())


def read_original(level_dir: str) -> list[ImageRecord]:
  """Reads images of the original generator with the trace of their drawing.

  ``level_dir`` holds ``imgs/.../*.png`` and :data:`TRACE_FILE`: one JSON object per line and
  image, ``{"file": "imgs/0/sample_3.png", "label": 0, "markers": [[r, c], [r, c]],
  "targets": [[[y0, x0, y1, x1], ...], [...]], "distractors": [[[y0, x0, y1, x1], ...], ...],
  "attempts": 12}``: the image file (relative to ``level_dir``), its label, the marker pixels
  (the ``coordinate`` passed to ``draw_circle``), every kept paddle of the two targets and of
  the distractors, from start to end in drawing order, and the calls of ``two_snakes`` it
  took. Such a trace comes from an instrumented run of ``snakes2.py`` (not part of this
  project; the comparison's README says how it was made).

  Returns:
    The records, in the trace's order.

  Raises:
    FileNotFoundError: when the trace or an image is missing (naming the path).
    ValueError: for a malformed trace line (naming the file and line).
  """
  from PIL import Image  # pylint: disable=import-outside-toplevel
  path = os.path.join(level_dir, TRACE_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no {TRACE_FILE} in {level_dir}: the comparison needs the trace "
                            f"of the original generator's run")
  records = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
        contours = [[tuple(float(v) for v in paddle) for paddle in contour]
                    for contour in (*row["targets"], *row["distractors"])]
        markers = tuple(tuple(int(v) for v in m) for m in row["markers"])
        label, name = int(row["label"]), row["file"]
      except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}:{number}: malformed trace line ({e})") from None
      if len(markers) != 2 or label not in (0, 1):
        raise ValueError(f"{path}:{number}: expected two markers and a label of 0 or 1")
      with Image.open(os.path.join(level_dir, name)) as im:
        image = np.asarray(im.convert("L"), dtype=np.uint8)
      records.append(ImageRecord(image=image, label=label, markers=markers, contours=contours,
                                 num_paddles=sum(len(c) for c in contours),
                                 attempts=row.get("attempts")))
  return records
