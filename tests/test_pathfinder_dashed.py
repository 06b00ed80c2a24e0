"""Tests for the default ``dashed`` Pathfinder generator (LRA's images, issue 31) and the
statistics that compare it with the original (``simpletron_jax.data.pathfinder.stats``).

The reference numbers are the original generator's (``drewlinsley/pathfinder``'s ``snakes2.py``
run with LRA's settings), committed in ``benchmarks/results/cpu/pathfinder_generators.json`` by
``benchmarks/pathfinder_generators.py``.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from PIL import Image

from configs import lra
from simpletron_jax.data import pathfinder as pf
from simpletron_jax.data.pathfinder import dashed_geometry, stats
from simpletron_jax.data.pathfinder import task as pf_task

REFERENCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "benchmarks", "results", "cpu", "pathfinder_generators.json")


def _original(key: str) -> dict:
  with open(REFERENCE, encoding="utf-8") as f:
    return json.load(f)["levels"][key]["original"]


def _records(resolution: int, level: str, n: int, seed: int = 0) -> list[stats.ImageRecord]:
  p = pf.dashed_params_for(resolution, level)
  return [stats.record_from_info(*pf.render_dashed_info(pf.dashed_example_rng(seed, p, i), p))
          for i in range(n)]


@pytest.fixture(scope="module")
def hard32():
  """60 images of Pathfinder-32 hard: (image, label, info) triples."""
  p = pf.dashed_params_for(32, "hard")
  return p, [pf.render_dashed_info(pf.dashed_example_rng(0, p, i), p) for i in range(60)]


# ----------------------------------------------------------------------------
# Settings.


def test_params_are_lras():
  """``lra_benchmarks/data/pathfinder.py`` over ``snakes2_wrapper.py``'s defaults."""
  p = pf.dashed_params_for(32, "hard")
  assert (p.resolution, p.contour_length, p.distractor_length, p.num_distractors,
          p.paddle_length, p.paddle_thickness, p.paddle_margins, p.padding, p.antialias_scale,
          p.seed_distance, p.marker_radius, p.continuity) == (
              32, 14, 4, 5, 2, 0.5, (1,), 1, 2, 7, 1.5, 1.0)
  assert (p.target_contrast, p.distractor_contrast, p.marker_contrast) == (1.5, 2.0, 1.0)
  assert (p.seed_tries, p.paddle_tries, p.distractor_tries) == (3, 3, 5)
  x = pf.dashed_params_for(128, "curv_contour_length_14")
  assert (x.paddle_length, x.paddle_thickness, x.paddle_margins, x.seed_distance,
          x.marker_radius, x.continuity, x.num_distractors, x.target_contrast,
          x.distractor_contrast) == (5, 1.5, (2, 3), 20, 3.0, 1.8, 35 // 4, 0.9, 0.9)
  for level, length in (("easy", 6), ("intermediate", 9), ("hard", 14)):
    for resolution, budget in ((32, 20), (128, 35)):
      q = pf.dashed_params_for(resolution, level)
      assert (q.contour_length, q.distractor_length) == (length, length // 3)
      assert q.num_distractors == budget // (length // 3)


def test_bad_settings_name_the_config_field(tmp_path):
  with pytest.raises(ValueError, match="data.resolution"):
    pf.dashed_params_for(64, "hard")
  with pytest.raises(ValueError, match="data.level"):
    pf.dashed_params_for(32, "medium")
  with pytest.raises(ValueError, match="data.generator"):
    pf.generate_dataset(str(tmp_path), seed=0, num_images=2, generator="dotted")
  with pytest.raises(ValueError, match="data.generator"):
    pf.ensure_generated(str(tmp_path), seed=0, num_images=2, generator="Dashed")
  assert not os.listdir(tmp_path), "nothing is written for a bad generator"
  with pytest.raises(ValueError, match="paddle_thickness"):
    pf.DashedParams(resolution=32, contour_length=6, distractor_length=2, num_distractors=10,
                    paddle_length=2, paddle_thickness=0.3, paddle_margins=(1,), padding=1,
                    antialias_scale=2, seed_distance=7, marker_radius=1.5, continuity=1.0,
                    target_contrast=1.0, distractor_contrast=1.0)


def test_configs_default_to_dashed_and_keep_solid_by_name():
  for task in ("pathfinder", "pathx"):
    for variant in (None, "tiny"):
      assert lra.make_config(task, "softmax", variant).data.generator == "dashed"
  assert pf.GENERATORS == ("dashed", "solid")
  assert pf.check_generator("solid") == "solid"


# ----------------------------------------------------------------------------
# The original's algorithm.


def test_first_paddle_angles_follow_opencv_border():
  """At 32 x 32 the original's first-paddle kernel lies on one side of its anchor for 330 of
  the 360 angles; OpenCV's dilation then leaves -DBL_MAX on the border and the original finds
  no free pixel. At 128 x 128 (larger paddles) only a corner pixel can read wholly outside:
  for -59..-54 degrees at margin 2 (checked against OpenCV 5.0), for no angle at margin 3."""
  g32 = dashed_geometry._geometry(pf.dashed_params_for(32, "hard"), 1)
  failing = [d for d in range(-180, 180) if g32.reads_outside(d)]
  assert len(failing) == 330
  for d in range(-180, 180):
    dy, dx = g32.pad.kernel(d)
    one_sided = (dy > 0).all() or (dy < 0).all() or (dx > 0).all() or (dx < 0).all()
    assert one_sided == (d in failing)
  for margin, expected in ((2, list(range(-59, -53))), (3, [])):
    g128 = dashed_geometry._geometry(pf.dashed_params_for(128, "hard"), margin)
    assert [d for d in range(-180, 180) if g128.reads_outside(d)] == expected


def test_contours_are_dashed_chains(hard32):
  """Paddle counts, gaps of about 2 * margin, turns within 90 / continuity degrees, and the
  first paddles of distractors and of target 0 at one of the 30 angles that can start."""
  p, examples = hard32
  g = dashed_geometry._geometry(p, 1)
  starting = {d for d in range(-180, 180) if not g.reads_outside(d)}
  for _, _, info in examples:
    assert [len(t) for t in info["targets"]] == [p.contour_length] * 2
    assert all(len(d) == p.distractor_length for d in info["distractors"])
    assert len(info["distractors"]) <= p.num_distractors
    contours = info["targets"] + info["distractors"]
    gaps, turns = stats.gaps_and_turns(contours)
    margin = info["margin"]
    assert gaps.min() >= 0 and gaps.max() <= 2 * margin + 2
    assert turns.max() <= 90 / p.continuity + 1e-6
    for contour in [info["targets"][0]] + info["distractors"]:
      y0, x0, y1, x1 = contour[0]
      degree = round(math.degrees(math.atan2(y1 - y0, x1 - x0)))
      assert ((degree + 180) % 360) - 180 in starting
  # Few distractors fit at 32 x 32: the original averages (32.6 - 28) / 4 = 1.2 per hard image.
  assert 0.5 < np.mean([len(info["distractors"]) for _, _, info in examples]) < 2.5


def test_markers_follow_the_label(hard32):
  """Label 1: the tail of one target and the far end of its last paddle; label 0: the tail of
  one target and the far end of the other's."""
  _, examples = hard32
  labels = set()
  for _, label, info in examples:
    tails = [tuple(int(v) for v in t[0][:2]) for t in info["targets"]]
    tips = [tuple(int(v) for v in t[-1][2:]) for t in info["targets"]]
    first, second = info["markers"]
    i = tails.index(first)
    assert second == tips[i if label else 1 - i]
    labels.add(label)
  assert labels == {0, 1}


def test_scene_does_not_depend_on_the_label():
  """The same random state drawn with either label differs only around the markers."""
  p = pf.dashed_params_for(128, "easy")
  for i in range(2):
    pos, _, a = pf.render_dashed_info(pf.dashed_example_rng(4, p, i), p, label=1)
    neg, _, b = pf.render_dashed_info(pf.dashed_example_rng(4, p, i), p, label=0)
    assert a["targets"] == b["targets"] and a["distractors"] == b["distractors"]
    assert a["markers"][0] == b["markers"][0] and a["markers"][1] != b["markers"][1]
    rows, cols = np.nonzero(pos != neg)
    centres = np.array(a["markers"] + b["markers"])
    near = np.hypot(rows[:, None] - centres[None, :, 0], cols[:, None] - centres[None, :, 1])
    assert len(rows) and (near.min(axis=1) <= p.marker_radius + 3).all()


def test_render_is_deterministic_and_scaled_to_255():
  p = pf.dashed_params_for(32, "intermediate")
  a, la = pf.render_dashed(pf.dashed_example_rng(3, p, 7), p)
  b, lb = pf.render_dashed(pf.dashed_example_rng(3, p, 7), p)
  c, _ = pf.render_dashed(pf.dashed_example_rng(4, p, 7), p)
  np.testing.assert_array_equal(a, b)
  assert la == lb and not np.array_equal(a, c)
  assert a.dtype == np.uint8 and a.shape == (32, 32) and a.max() == 255 and a.min() == 0


# ----------------------------------------------------------------------------
# Statistics against the original.


def _assert_close_to_original(ours: dict, original: dict) -> None:
  assert abs(ours["lit_fraction"] - original["lit_fraction"]) < 0.02
  assert abs(ours["paddles"] - original["paddles"]) < 1.5
  assert abs(ours["gap_mean"] - original["gap_mean"]) < 0.15
  assert abs(ours["turn_mean"] - original["turn_mean"]) < 3.0
  assert stats.total_variation(ours["gap_hist"], original["gap_hist"]) < 0.06
  assert stats.total_variation(ours["turn_hist"], original["turn_hist"]) < 0.06
  for label in ("0", "1"):   # about 3 standard errors for 100 images of a label
    reference = original["marker_distance"][label]
    assert abs(ours["marker_distance"][label] - reference) < 0.15 * reference
  assert abs(ours["cc_accuracy"] - original["cc_accuracy"]) < 0.15
  assert 0.65 < ours["attempts_mean"] / original["attempts_mean"] < 1.5


@pytest.mark.parametrize("resolution,level,n", [(32, "intermediate", 200), (32, "hard", 150),
                                                (128, "easy", 80)])
def test_statistics_match_the_original(resolution, level, n):
  _assert_close_to_original(stats.summarize(_records(resolution, level, n)),
                            _original(f"{resolution}/{level}"))


def test_statistics_tell_the_solid_generator_from_the_original():
  """The check can fail: the solid generator's images are not the original's."""
  p = pf.params_for(32, "intermediate")
  solid = [stats.record_from_info(*pf.render_example_info(pf.example_rng(0, p, i), p))
           for i in range(100)]
  with pytest.raises(AssertionError):
    _assert_close_to_original(stats.summarize(solid), _original("32/intermediate"))


def test_connected_components_read_solid_labels_not_dashed_ones():
  """The solid option's label is on the pixels; the dashed task's is not."""
  p = pf.params_for(32, "hard")
  solid = [stats.record_from_info(*pf.render_example_info(pf.example_rng(0, p, i), p))
           for i in range(40)]
  assert stats.summarize(solid)["cc_accuracy"] == 1.0
  assert stats.summarize(_records(32, "easy", 80))["cc_accuracy"] < 0.75


def test_stats_helpers():
  image = np.zeros((8, 8), np.uint8)
  image[1, 1:6] = 9
  image[4, 1:3] = 9
  assert stats.connected_label(image, ((1, 1), (1, 5))) == 1
  assert stats.connected_label(image, ((1, 1), (4, 2))) == 0
  image[2:4, 1] = 3   # a dim bridge joins them above threshold 0, not above 5
  assert stats.connected_label(image, ((1, 1), (4, 2))) == 1
  assert stats.connected_label(image, ((1, 1), (4, 2)), threshold=5) == 0
  gaps, turns = stats.gaps_and_turns([[(0, 0, 0, 2), (0, 4, 0, 6), (1, 7, 3, 7)]])
  np.testing.assert_allclose(gaps, [2.0, math.sqrt(2)])
  np.testing.assert_allclose(turns, [0.0, 90.0])
  assert stats.total_variation([0.5, 0.5], [1.0, 0.0]) == 0.5


def test_read_original(tmp_path):
  level = tmp_path / "pathfinder32" / "curv_baseline"
  (level / "imgs" / "0").mkdir(parents=True)
  image = np.zeros((32, 32), np.uint8)
  image[3, 3:8] = 200
  Image.fromarray(image, mode="L").save(level / "imgs" / "0" / "sample_0.png")
  row = {"file": "imgs/0/sample_0.png", "label": 1, "markers": [[3, 3], [3, 7]],
         "targets": [[[3, 3, 3, 5], [3, 6, 3, 8]], [[9, 9, 9, 11]]], "distractors": [],
         "attempts": 4}
  with pytest.raises(FileNotFoundError, match="orig_trace.jsonl"):
    stats.read_original(str(level))
  (level / stats.TRACE_FILE).write_text(json.dumps(row) + "\n")
  (record,) = stats.read_original(str(level))
  assert record.num_paddles == 3 and record.attempts == 4 and record.label == 1
  np.testing.assert_array_equal(record.image, image)
  assert stats.summarize([record])["cc_accuracy"] == 1.0
  (level / stats.TRACE_FILE).write_text(json.dumps(row) + "\n{\"file\": 3}\n")
  with pytest.raises(ValueError, match=r"orig_trace.jsonl:2: malformed"):
    stats.read_original(str(level))


# ----------------------------------------------------------------------------
# Files.


def test_generated_level_is_lras_layout_with_the_originals_columns(tmp_path):
  one = pf.ensure_generated(str(tmp_path / "a"), seed=1, resolution=32, level="easy",
                            num_images=12, num_workers=1, progress=False, images_per_shard=8)
  two = pf.ensure_generated(str(tmp_path / "b"), seed=1, resolution=32, level="easy",
                            num_images=12, num_workers=2, progress=False, images_per_shard=8)
  assert os.path.basename(one) == "dashed_seed1_n12"
  level_dir = os.path.join(one, "pathfinder32", "curv_baseline")
  with open(os.path.join(level_dir, "simpletron_generated.json"), encoding="utf-8") as f:
    done = json.load(f)
  assert done["arguments"]["generator"] == "dashed" and done["stats"]["generator"] == "dashed"
  p = pf.dashed_params_for(32, "easy")
  for shard, count in ((0, 8), (1, 4)):
    lines = (open(os.path.join(level_dir, "metadata", f"{shard}.npy"), encoding="utf-8")
             .read().split("\n")[:-1])
    assert len(lines) == count
    for j, line in enumerate(lines):
      cols = line.split(" ")
      # snakes2.py's accumulate_meta: folder, file, index, label, continuity, contour length,
      # distractor length, paddle length, thickness, margin, number of paddle contrasts.
      assert cols[:3] == [f"imgs/{shard}", f"sample_{j}.png", str(j)]
      assert cols[4:] == ["1", "6", "2", "2", "0.5", "1", "1"]
      png = np.asarray(Image.open(os.path.join(level_dir, cols[0], cols[1])))
      expected, label = pf.render_dashed(pf.dashed_example_rng(1, p, shard * 8 + j), p)
      np.testing.assert_array_equal(png, expected)
      assert int(cols[3]) == label
      other = os.path.join(two, "pathfinder32", "curv_baseline", cols[0], cols[1])
      np.testing.assert_array_equal(np.asarray(Image.open(other)), png)
  splits = pf.load_pathfinder(one, resolution=32, level="easy", seed=0, progress=False)
  assert sum(len(s) for s in splits.values()) == 12


@pytest.mark.parametrize("generator", ["dashed", "solid"])
def test_the_task_loader_generates_with_the_configured_generator(generator, monkeypatch,
                                                                 tmp_path):
  from simpletron_jax.data import tasks  # pylint: disable=import-outside-toplevel

  class Asked(Exception):
    pass

  def ensure_generated(cache_dir, **kwargs):
    raise Asked(kwargs["generator"])

  monkeypatch.setattr(pf_task, "ensure_generated", ensure_generated)   # where the loader reads it
  config = lra.make_config("pathfinder", "simple", "tiny")
  config.data.generator = generator
  config.data.data_dir = None
  config.data.cache_dir = str(tmp_path)
  with pytest.raises(Asked, match=f"^{generator}$"):
    tasks.load_task(tasks.data_config(config))
