"""Tests for simpletron_jax.data.pathfinder: the ``solid`` generator, LRA layout writer and loader
(the default ``dashed`` generator: tests/test_pathfinder_dashed.py).

The labels are checked on the pixels alone, with a breadth-first connected-component labelling
written here (independent of the generator's own scipy check).
"""

from __future__ import annotations

import filecmp
import os

import numpy as np
import pytest
from PIL import Image

from simpletron_jax.data import pathfinder as pf
from simpletron_jax.data.pathfinder import generate as pf_generate

# ----------------------------------------------------------------------------
# Reference pixel analysis.


def _components(on_HxW: np.ndarray) -> tuple[np.ndarray, int]:
  """8-connected components of a bool image by breadth-first search: (labels, count)."""
  h, w = on_HxW.shape
  on = on_HxW.tolist()
  labels = [[0] * w for _ in range(h)]
  count = 0
  for r in range(h):
    for c in range(w):
      if not on[r][c] or labels[r][c]:
        continue
      count += 1
      labels[r][c] = count
      queue = [(r, c)]
      while queue:
        y, x = queue.pop()
        for yy in (y - 1, y, y + 1):
          for xx in (x - 1, x, x + 1):
            if 0 <= yy < h and 0 <= xx < w and on[yy][xx] and not labels[yy][xx]:
              labels[yy][xx] = count
              queue.append((yy, xx))
  return np.asarray(labels), count


def _erode(on_HxW: np.ndarray, k: int) -> np.ndarray:
  """True where the whole k x k square centred on the pixel is lit (outside = dark)."""
  h, w = on_HxW.shape
  j = k // 2
  padded = np.zeros((h + 2 * j, w + 2 * j), bool)
  padded[j:j + h, j:j + w] = on_HxW
  out = np.ones_like(on_HxW)
  for dr in range(k):
    for dc in range(k):
      out &= padded[dr:dr + h, dc:dc + w]
  return out


def _analyse(image_HxW: np.ndarray, k: int) -> dict:
  """Components, marker blobs (k x k lit squares) and whether the markers are joined."""
  on = image_HxW > 0
  labels, count = _components(on)
  blobs, n_blobs = _components(_erode(on, k))
  marker_components = sorted({int(labels[blobs == b][0]) for b in range(1, n_blobs + 1)})
  return {"components": count, "blobs": n_blobs, "marker_components": marker_components,
          "labels": labels, "blob_map": blobs}


def _check_label(image_HxW: np.ndarray, label: int, params: pf.PathfinderParams) -> dict:
  a = _analyse(image_HxW, params.marker_core_size())
  assert a["blobs"] == 2, "an image must show exactly two markers"
  assert a["components"] == params.num_paths, "each path must be one separate component"
  joined = len(a["marker_components"]) == 1
  assert joined == bool(label), f"label {label} but markers joined={joined}"
  return a


@pytest.fixture(scope="module")
def hard32():
  """80 images of Pathfinder-32 hard: (image, label, info) triples."""
  p = pf.params_for(32, "hard")
  return p, [pf.render_example_info(pf.example_rng(0, p, i), p) for i in range(80)]


# ----------------------------------------------------------------------------
# Settings.


def test_params_are_lras():
  assert pf.LEVELS == {"easy": "curv_baseline", "intermediate": "curv_contour_length_9",
                       "hard": "curv_contour_length_14"}
  p = pf.params_for(32, "hard")
  assert (p.resolution, p.contour_length, p.paddle_length, p.paddle_thickness,
          p.paddle_margins, p.contrast, p.marker_radius, p.padding, p.antialias_scale,
          p.seed_distance) == (32, 14, 2.0, 0.5, (1,), 0.75, 1.5, 1, 2, 7.0)
  assert (p.distractor_length, p.num_distractors) == (14 // 3, 20 // (14 // 3))
  for level, length in (("easy", 6), ("intermediate", 9), ("hard", 14)):
    q = pf.params_for(32, level)
    assert q.contour_length == length == pf.params_for(128, pf.LEVELS[level]).contour_length
    assert q.num_distractors == 20 // (length // 3)
  x = pf.params_for(128, "hard")
  assert (x.paddle_thickness, x.paddle_margins, x.marker_radius, x.seed_distance,
          x.num_distractors, x.contrast) == (1.5, (2, 3), 3.0, 20.0, 35 // 4, 0.9)
  assert pf.NUM_CLASSES == 2 and pf.VOCAB_SIZE == 256


def test_bad_resolution_and_level_name_the_config_field():
  with pytest.raises(ValueError, match="data.resolution"):
    pf.params_for(64, "hard")
  with pytest.raises(ValueError, match="data.level"):
    pf.params_for(32, "medium")


@pytest.mark.parametrize("resolution", [32, 128])
def test_marker_core_size_matches_a_brute_force_disc(resolution):
  p = pf.params_for(resolution, "hard")
  s, r = p.antialias_scale, p.marker_radius
  size = 21
  centre = size // 2 + 0.5
  sub = (np.arange(size * s) + 0.5) / s - centre
  lit = (sub[None, :] ** 2 + sub[:, None] ** 2 <= r * r).reshape(size, s, size, s).any((1, 3))
  k = max(k for k in range(1, size, 2)
          if lit[size // 2 - k // 2:size // 2 + k // 2 + 1,
                 size // 2 - k // 2:size // 2 + k // 2 + 1].all())
  assert p.marker_core_size() == k


# ----------------------------------------------------------------------------
# The generator: labels on the pixels.


def test_hard32_labels_follow_connectivity(hard32):
  p, examples = hard32
  for image, label, info in examples:
    assert image.shape == (32, 32) and image.dtype == np.uint8
    a = _check_label(image, label, p)
    # The blobs found on the pixels are where the generator put the markers.
    for row, col in info["markers"]:
      assert a["blob_map"][row, col] > 0
  labels = np.array([label for _, label, _ in examples])
  assert 0.3 < labels.mean() < 0.7, "the label is a fair coin"


@pytest.mark.parametrize("resolution,level,n", [(32, "easy", 20), (32, "intermediate", 20),
                                                (128, "hard", 4)])
def test_other_levels_follow_connectivity(resolution, level, n):
  p = pf.params_for(resolution, level)
  labels = set()
  for i in range(n):
    image, label = pf.render_example(pf.example_rng(1, p, i), p)
    assert image.shape == (resolution, resolution)
    _check_label(image, label, p)
    labels.add(label)
  if n >= 20:
    assert labels == {0, 1}


def test_checker_detects_a_bridge(hard32):
  """The reference check can fail: joining the two markers of a negative flips it."""
  p, examples = hard32
  image, label, info = next(e for e in examples if e[1] == 0)
  _check_label(image, 0, p)
  (ra, ca), (rb, cb) = info["markers"]
  bridged = image.copy()
  for t in np.linspace(0, 1, 200):
    bridged[int(round(ra + t * (rb - ra))), int(round(ca + t * (cb - ca)))] = 200
  assert len(_analyse(bridged, p.marker_core_size())["marker_components"]) == 1
  with pytest.raises(AssertionError):
    _check_label(bridged, 0, p)


def test_classes_share_settings(hard32):
  p, examples = hard32
  by_label = {0: [], 1: []}
  for image, label, info in examples:
    assert (info["num_paths"], info["contour_length"], info["distractor_length"]) == (
        p.num_paths, 14, 4)
    by_label[label].append(int((image > 0).sum()))
    # The markers are as far apart as the ends of long path 0 (exactly for label 1).
    (a, b), (c, d) = info["markers"]
    (e, f), (g, h) = info["path_ends"][0]
    gap = abs(np.hypot(a - c, b - d) - np.hypot(e - g, f - h))
    assert gap <= (0 if label else p.marker_distance_tolerance) + 1e-9
    assert np.hypot(a - c, b - d) >= p.seed_distance
  pos, neg = np.mean(by_label[1]), np.mean(by_label[0])
  assert abs(pos - neg) < 0.1 * (pos + neg) / 2, "lit area must not give the label away"


@pytest.mark.parametrize("resolution", [32, 128])
def test_scene_does_not_depend_on_the_label(resolution):
  """The same random state drawn as a positive and as a negative differs only in the markers."""
  p = pf.params_for(resolution, "hard")
  r = p.marker_radius + 1
  for i in range(6 if resolution == 32 else 2):
    pos, _, info_pos = pf.render_example_info(pf.example_rng(9, p, i), p, label=1)
    neg, _, info_neg = pf.render_example_info(pf.example_rng(9, p, i), p, label=0)
    assert info_pos["attempts"] == info_neg["attempts"] == 1
    assert info_pos["path_ends"] == info_neg["path_ends"]
    _check_label(pos, 1, p)
    _check_label(neg, 0, p)
    rows, cols = np.nonzero(pos != neg)
    assert len(rows) > 0
    centres = np.array(info_pos["markers"] + info_neg["markers"])
    near = np.hypot(rows[:, None] - centres[None, :, 0], cols[:, None] - centres[None, :, 1])
    assert (near.min(axis=1) <= r).all(), "pixels away from the markers changed with the label"


def test_render_is_deterministic_for_a_seed():
  p = pf.params_for(32, "hard")
  a = pf.render_example(pf.example_rng(3, p, 7), p)
  b = pf.render_example(pf.example_rng(3, p, 7), p)
  c = pf.render_example(pf.example_rng(4, p, 7), p)
  np.testing.assert_array_equal(a[0], b[0])
  assert a[1] == b[1]
  assert not np.array_equal(a[0], c[0])
  rng = np.random.default_rng(11)
  first = pf.render_example(rng, p)[0]
  assert not np.array_equal(first, pf.render_example(rng, p)[0])


# ----------------------------------------------------------------------------
# Files: write, read, split.


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
  """40 images of 32x32 hard in 3 shards, once with 1 worker and once with 2."""
  root = tmp_path_factory.mktemp("pf")
  one, two = str(root / "one"), str(root / "two")
  stats = pf.generate_dataset(one, seed=5, resolution=32, level="hard", num_images=40,
                              num_workers=1, progress=False, images_per_shard=16,
                              generator="solid")
  pf.generate_dataset(two, seed=5, resolution=32, level="hard", num_images=40, num_workers=2,
                      progress=False, images_per_shard=16, generator="solid")
  return one, two, stats


def test_layout_and_metadata_rows_as_lra_reads_them(generated):
  one, _, stats = generated
  level_dir = os.path.join(one, "pathfinder32", "curv_contour_length_14")
  assert stats["level_dir"] == level_dir and stats["num_images"] == 40
  assert stats["images_per_second"] > 0 and 0 <= stats["redrawn_fraction"] <= 1
  assert sorted(os.listdir(os.path.join(level_dir, "metadata"))) == ["0.npy", "1.npy", "2.npy"]
  p = pf.params_for(32, "hard")
  count = 0
  for shard in range(3):
    with open(os.path.join(level_dir, "metadata", f"{shard}.npy"), encoding="utf-8") as f:
      text = f.read()
    lines = text.split("\n")[:-1]  # as LRA's _generate_examples
    assert text.endswith("\n") and len(lines) == (16 if shard < 2 else 8)
    for j, line in enumerate(lines):
      cols = line.split(" ")
      assert cols[:3] == [f"imgs/{shard}", f"sample_{j}.png", str(j)]
      image = np.asarray(Image.open(os.path.join(level_dir, cols[0], cols[1])))
      expected, label = pf.render_example(pf.example_rng(5, p, shard * 16 + j), p)
      np.testing.assert_array_equal(image, expected)
      assert int(cols[3]) == label
      count += 1
  assert count == 40
  assert not [f for _, _, files in os.walk(one) for f in files if f.endswith(".tmp")]


def test_output_does_not_depend_on_workers(generated):
  one, two, _ = generated
  for folder, _, files in os.walk(one):
    for name in files:
      if name == "simpletron_generated.json":
        continue
      other = os.path.join(two, os.path.relpath(os.path.join(folder, name), one))
      assert filecmp.cmp(os.path.join(folder, name), other, shallow=False), name


def test_round_trip_tokens_are_the_pixels(generated):
  one, _, _ = generated
  splits = pf.load_pathfinder(one, resolution=32, level="hard", seed=0, progress=False)
  assert [len(splits[s]) for s in ("train", "val", "test")] == [32, 4, 4]
  p = pf.params_for(32, "hard")
  expected = {}
  for i in range(40):
    image, label = pf.render_example(pf.example_rng(5, p, i), p)
    expected[image.tobytes()] = label
  seen = set()
  for split in splits.values():
    assert split.explicit_mask and split.tokens.dtype == np.uint8
    assert np.all(split.lengths == 1024)
    for i in range(len(split)):
      key = split.example(i).tobytes()
      assert expected[key] == split.labels[i]
      seen.add(key)
  assert len(seen) == 40, "splits are disjoint and cover every image"


def test_split_is_seeded(generated):
  one, _, _ = generated
  load = lambda seed: pf.load_pathfinder(one, resolution=32, level="curv_contour_length_14",
                                         seed=seed, progress=False)
  a, b, c = load(0), load(0), load(1)
  np.testing.assert_array_equal(a["test"].tokens, b["test"].tokens)
  assert not np.array_equal(a["test"].tokens, c["test"].tokens)
  halves = pf.load_pathfinder(one, resolution=32, level="hard", seed=0, progress=False,
                              split_fractions=[0.5, 0.25, 0.25])
  assert [len(halves[s]) for s in ("train", "val", "test")] == [20, 10, 10]
  with pytest.raises(ValueError, match="split_fractions"):
    pf.load_pathfinder(one, resolution=32, level="hard", seed=0, split_fractions=(0.8, 0.3, 0))


def test_ensure_generated_reuses_finished_data(tmp_path, monkeypatch):
  root = pf.ensure_generated(str(tmp_path), seed=2, resolution=32, level="easy", num_images=6,
                             num_workers=1, progress=False, generator="solid")
  assert len(pf.load_pathfinder(root, resolution=32, level="easy", seed=0,
                                progress=False)["train"]) == 5

  def fail(*args, **kwargs):
    raise AssertionError("regenerated finished data")

  monkeypatch.setattr(pf_generate, "generate_dataset", fail)
  assert pf.ensure_generated(str(tmp_path), seed=2, resolution=32, level="easy",
                             num_images=6, progress=False, generator="solid") == root
  with pytest.raises(AssertionError, match="regenerated"):
    pf.ensure_generated(str(tmp_path), seed=3, resolution=32, level="easy", num_images=6,
                        generator="solid")
  with pytest.raises(AssertionError, match="regenerated"):   # the other generator's data
    pf.ensure_generated(str(tmp_path), seed=2, resolution=32, level="easy", num_images=6)


# ----------------------------------------------------------------------------
# LRA's release layout and errors.


def _lra_like(root, rows, size=32):
  """An lra_release-style folder: pathfinder32/curv_baseline with the given metadata rows.

  ``rows``: (image file or None for no file, label, extra) tuples for metadata/0.npy.
  """
  level_dir = root / "lra_release" / "pathfinder32" / "curv_baseline"
  (level_dir / "imgs" / "0").mkdir(parents=True)
  (level_dir / "metadata").mkdir()
  lines = []
  rng = np.random.default_rng(0)
  for j, (kind, label) in enumerate(rows):
    name = f"sample_{j}.png"
    path = level_dir / "imgs" / "0" / name
    if kind == "png":
      Image.fromarray(rng.integers(0, 256, (size, size), dtype=np.uint8), mode="L").save(path)
    elif kind == "empty":
      path.write_bytes(b"")
    lines.append(f"imgs/0 {name} {j} {label} 1.0 6 2 2 0.5 1 1\n")
  (level_dir / "metadata" / "0.npy").write_text("".join(lines))
  return level_dir


def test_reads_an_lra_release_folder(tmp_path):
  level_dir = _lra_like(tmp_path, [("png", 0), ("png", 1), ("empty", 1), ("png", 1)] * 5)
  with pytest.warns(UserWarning, match="5 empty PNG"):
    splits = pf.load_pathfinder(str(tmp_path), resolution=32, level="easy", seed=0,
                                progress=False)
  assert sum(len(s) for s in splits.values()) == 15
  train = splits["train"]
  for i in range(len(train)):
    # Find the file with these pixels: the tokens are its values, row-major.
    matches = [j for j in range(20) if (level_dir / "imgs" / "0" / f"sample_{j}.png").stat()
               .st_size and np.array_equal(np.asarray(Image.open(
                   level_dir / "imgs" / "0" / f"sample_{j}.png")).reshape(-1), train.example(i))]
    assert len(matches) == 1 and train.labels[i] == (0 if matches[0] % 4 == 0 else 1)
  # The same level found from the lra_release and pathfinder32 folders.
  with pytest.warns(UserWarning):
    again = pf.load_pathfinder(str(tmp_path / "lra_release" / "pathfinder32"), resolution=32,
                               level="curv_baseline", seed=0, progress=False)
  np.testing.assert_array_equal(again["test"].tokens, splits["test"].tokens)


def test_reads_binary_npy_metadata(tmp_path):
  level_dir = _lra_like(tmp_path, [("png", 0), ("png", 1), ("png", 1), ("png", 0)])
  text = (level_dir / "metadata" / "0.npy").read_text()
  (level_dir / "metadata" / "0.npy").unlink()
  np.save(level_dir / "metadata" / "0.npy", np.array([line.split() for line in
                                                      text.splitlines()]))
  splits = pf.load_pathfinder(str(tmp_path), resolution=32, level="easy", seed=0,
                              split_fractions=(0.5, 0.25, 0.25), progress=False)
  labels = sorted(int(v) for s in splits.values() for v in s.labels)
  assert labels == [0, 0, 1, 1]


def test_missing_folder_names_data_dir(tmp_path):
  with pytest.raises(FileNotFoundError, match="data.data_dir"):
    pf.load_pathfinder(str(tmp_path), resolution=32, level="hard", seed=0)


def test_missing_png_names_the_metadata_row(tmp_path):
  _lra_like(tmp_path, [("png", 0), ("png", 1), (None, 0)])
  with pytest.raises(FileNotFoundError, match=r"0\.npy:3: image .*sample_2\.png"):
    pf.load_pathfinder(str(tmp_path), resolution=32, level="easy", seed=0)


def test_wrong_size_names_the_metadata_row(tmp_path):
  _lra_like(tmp_path, [("png", 0), ("png", 1)], size=20)
  with pytest.raises(ValueError, match=r"0\.npy:\d: .* is 20x20 pixels, expected 32x32"):
    pf.load_pathfinder(str(tmp_path), resolution=32, level="easy", seed=0)


def test_bad_metadata_rows(tmp_path):
  level_dir = _lra_like(tmp_path, [("png", 0), ("png", 7)])
  with pytest.raises(ValueError, match=r"0\.npy:2: label .* '7'"):
    pf.load_pathfinder(str(tmp_path), resolution=32, level="easy", seed=0)
  (level_dir / "metadata" / "0.npy").write_text("imgs/0 sample_0.png 0\n")
  with pytest.raises(ValueError, match=r"0\.npy:1: expected at least 4"):
    pf.load_pathfinder(str(tmp_path), resolution=32, level="easy", seed=0)
