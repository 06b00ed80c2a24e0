"""LRA's evaluation data as options (issue 36): CIFAR-10's 90/10 split (``data.lra_split``),
Pathfinder's tfds split (``data.split_hash="lra"``) and the dropped last eval batch
(``data.drop_last_eval_batch``). Defaults stay as they were; ``:lra_code`` turns all on."""

from __future__ import annotations

import ml_collections
import numpy as np
import pytest
from PIL import Image

from configs import lra
from simpletron_jax.data import batches, image, pathfinder as pf, tasks
from simpletron_jax.data.common import RaggedExamples
from tests.conftest import fake_tfds

# ----------------------------------------------------------------------------
# Config fields.


def test_lra_code_turns_the_data_options_on_and_defaults_stay_off():
  for task, fields in (("image", ("lra_split", "drop_last_eval_batch")),
                       ("pathfinder", ("split_hash", "drop_last_eval_batch")),
                       ("pathx", ("split_hash", "drop_last_eval_batch")),
                       ("retrieval", ("drop_last_eval_batch",))):
    default, lra_code = lra.make_config(task, "softmax"), lra.make_config(task, "softmax",
                                                                          "lra_code")
    for field in fields:
      on = "lra" if field == "split_hash" else True
      off = "blake2b" if field == "split_hash" else False
      assert (default.data[field], lra_code.data[field]) == (off, on), (task, field)
  for task in ("listops", "text"):   # LRA keeps their last batch (drop_remainder=False)
    assert "drop_last_eval_batch" not in lra.make_config(task, "softmax", "lra_code").data


def test_an_option_an_older_config_lacks_is_the_records_default():
  # The config.json of a run made before an option existed: the reader takes the task
  # record's default, written once (TaskSpec.data_options).
  for task, field in (("pathfinder", "split_hash"), ("pathx", "generator"),
                      ("text", "val_fraction"), ("listops", "task_name")):
    tree = lra.make_config(task, "softmax", "tiny").to_dict()
    tree["data"][field] = "set" if field != "val_fraction" else 0.5
    data = tasks.data_config(ml_collections.ConfigDict(tree))
    assert getattr(data, field) == tree["data"][field]
    del tree["data"][field]
    assert (getattr(tasks.data_config(ml_collections.ConfigDict(tree)), field)
            == tasks.get(task).data_options[field]), (task, field)
  config = lra.make_config("text", "softmax", "tiny")
  config.data.nope = 1
  with pytest.raises(ValueError, match="^data.nope is not a data setting of task 'text'; its "
                                       "settings: seed, data_dir, "):
    tasks.data_config(config)


# ----------------------------------------------------------------------------
# CIFAR-10: data.lra_split reaches load_image through tasks.py.


def _image_config(data_dir, **data):
  config = lra.make_config("image", "softmax", "tiny")
  config.data.data_dir = str(data_dir)
  for key, value in data.items():
    config.data[key] = value
  return config


def test_lra_split_reaches_load_image(tmp_path):
  n = 50
  x = np.zeros((n, 32, 32), np.uint8)
  x[:, 0, 0] = np.arange(n)                 # pixel 0 names the image
  y = (np.arange(n) % 10).astype(np.uint8)
  np.savez(tmp_path / image.NPZ_NAME, x_train=x, y_train=y, x_test=x[:10], y_test=y[:10])

  def ids(split):
    return sorted(int(split.example(i)[0]) for i in range(len(split)))

  lra_data = tasks.load_task(tasks.data_config(_image_config(tmp_path, lra_split=True)))
  assert ids(lra_data.train) == list(range(45)) and ids(lra_data.val) == list(range(45, 50))
  seeded = tasks.load_task(tasks.data_config(_image_config(tmp_path)))   # a seeded draw
  assert len(seeded.val) == 5 and ids(seeded.val) != list(range(45, 50))
  with pytest.raises(ValueError, match=r"^data.lra_split='yes' must be True or False$"):
    tree = _image_config(tmp_path).to_dict()   # a config built outside lra.py
    tree["data"]["lra_split"] = "yes"
    tasks.data_config(ml_collections.ConfigDict(tree))


def test_lra_split_is_tfds_train_90_percent(tmp_path):
  """With a tfds source, data.lra_split gives tfds's own ``train[:90%]`` / ``train[90%:]``."""
  tfds = pytest.importorskip("tensorflow_datasets")
  rng = np.random.default_rng(0)
  n = 40
  rgb = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
  rows = {"train": [{"image": rgb[i], "label": i % 10, "id": f"train_{i:05d}"}
                    for i in range(n)],
          "test": [{"image": rgb[i], "label": i % 10, "id": f"test_{i:05d}"} for i in range(4)]}
  features = {"image": tfds.features.Tensor(shape=(32, 32, 3), dtype=np.uint8),
              "label": tfds.features.ClassLabel(names=list(image.CLASSES)),
              "id": tfds.features.Text()}
  # keys: the row index, as tfds's cifar.py
  version_dir = fake_tfds(tmp_path, features, rows, to=tmp_path / "tfds" / "cifar10" / "3.0.2")
  out = image.load_image(data_dir=None, tfds_data_dir=str(tmp_path / "tfds"), seed=0,
                         lra_split=True)
  gray = {image.rgb_to_grayscale(rgb[i]).tobytes(): i for i in range(n)}
  got = {s: sorted(gray[out[s].example(i).tobytes()] for i in range(len(out[s])))
         for s in ("train", "val")}
  ref = tfds.builder_from_directory(str(version_dir))
  want = {s: sorted(int(r["id"][len("train_"):]) for r in
                    ref.as_data_source(split=f"train[{cut}]"))
          for s, cut in (("train", ":90%"), ("val", "90%:"))}
  assert got == want and len(got["val"]) == 4


# ----------------------------------------------------------------------------
# Pathfinder: data.split_hash="lra" is tfds's order of LRA's keys.


def test_lra_hash_is_tfds_md5_of_split_name_and_key():
  # Values of tensorflow_datasets.core.hashing.Hasher(salt).hash_key(key) (tfds 4.9.10).
  pinned = {("imgs/0_sample_0.png_1", "hard"): 0x874b24b03db3f7070dd89df923bca83a,
            ("imgs/12_sample_3.png_4", "easy"): 0x3b5bd91a8f36cf1f7f11ec2fc5aa9c1d,
            ("imgs/199_sample_999.png_1000", "intermediate"):
                0x732f205b743c39fc270d422b441af6f9}
  for (key, level), value in pinned.items():
    assert pf.lra_hash(key, level) == value
  assert pf.lra_hash("imgs/0_sample_0.png_1", "curv_contour_length_14") == pinned[
      ("imgs/0_sample_0.png_1", "hard")]   # the folder name is the same level
  assert pf.lra_example_key("imgs/0", "sample_0.png", 1) == "imgs/0_sample_0.png_1"
  try:
    from tensorflow_datasets.core import hashing  # pylint: disable=import-outside-toplevel
  except ImportError:
    return
  for (key, level), value in pinned.items():
    assert hashing.Hasher(level).hash_key(key) == value


def _lra_level(root, per_file=(12, 13), empty=((0, 5), (1, 0))):
  """pathfinder32/curv_baseline with one metadata file per entry of ``per_file``; pixel
  (0, 0) of each image is its global index + 1. ``empty``: (file, row) of empty PNGs."""
  level_dir = root / "pathfinder32" / "curv_baseline"
  (level_dir / "metadata").mkdir(parents=True)
  rng = np.random.default_rng(1)
  rows, index = [], 0
  for f, count in enumerate(per_file):
    (level_dir / "imgs" / str(f)).mkdir(parents=True)
    lines = []
    for j in range(count):
      path = level_dir / "imgs" / str(f) / f"sample_{j}.png"
      if (f, j) in empty:
        path.write_bytes(b"")
      else:
        pixels = rng.integers(1, 256, (32, 32), dtype=np.uint8)
        pixels[0, 0] = index + 1
        Image.fromarray(pixels, mode="L").save(path)
      lines.append(f"imgs/{f} sample_{j}.png {j} {index % 2} 1.0 6 2 2 0.5 1 1\n")
      rows.append((f"imgs/{f}", f"sample_{j}.png", j + 1, index, (f, j) in empty))
      index += 1
    (level_dir / "metadata" / f"{f}.npy").write_text("".join(lines))
  return rows


def _ids(split):
  return sorted(int(split.example(i)[0]) - 1 for i in range(len(split)))


# Members of each part for _lra_level's 25 rows, level "easy" (from tfds 4.9.10's hashing;
# test_pathfinder_lra_split_is_tfds_slicing checks them against tfds itself).
# Rows 5 and 12 are empty PNGs: 12 falls in val (stored rows 20..21), which keeps one image.
PINNED_EASY = {"train": [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 13, 14, 15, 16, 18, 19, 20, 22, 24],
               "val": [21],
               "test": [11, 17, 23]}


def test_pathfinder_lra_split_members(tmp_path):
  rows = _lra_level(tmp_path)
  with pytest.warns(UserWarning, match="2 empty PNG"):
    splits = pf.load_pathfinder(str(tmp_path), resolution=32, level="easy", seed=0,
                                progress=False, split_hash="lra")
  got = {s: _ids(splits[s]) for s in splits}
  # Independently: sort by MD5("easy" + key), cut at round(80 * 25 / 100) = 20 and
  # round(90 * 25 / 100) = round(22.5) = 22, then drop the empty PNGs.
  order = sorted(rows, key=lambda r: pf.lra_hash(f"{r[0]}_{r[1]}_{r[2]}", "easy"))
  want = {s: sorted(r[3] for r in part if not r[4])
          for s, part in (("train", order[:20]), ("val", order[20:22]), ("test", order[22:]))}
  assert got == want == PINNED_EASY
  for s in splits:   # labels follow the rows
    assert [int(v) for v in splits[s].labels[np.argsort(
        [int(splits[s].example(i)[0]) for i in range(len(splits[s]))])]] == [
            i % 2 for i in got[s]]
  # The seed does not matter, the file listing order does not matter.
  with pytest.warns(UserWarning):
    again = pf.load_pathfinder(str(tmp_path), resolution=32, level="easy", seed=7,
                               progress=False, split_hash="lra")
  assert {s: _ids(again[s]) for s in again} == got
  # The default blake2b split keeps LRA's sizes (of the non-empty rows), not its members.
  with pytest.warns(UserWarning):
    default = pf.load_pathfinder(str(tmp_path), resolution=32, level="easy", seed=0,
                                 progress=False)
  assert [len(default[s]) for s in ("train", "val", "test")] == [18, 3, 2]


def test_pathfinder_lra_split_is_tfds_slicing(tmp_path):
  """A tfds build of LRA's keys (salt: the level, as LRA's split name) sliced by tfds."""
  tfds = pytest.importorskip("tensorflow_datasets")
  rows = _lra_level(tmp_path / "data")
  examples = [(f"{folder}_{name}_{line}", {"index": index})
              for folder, name, line, index, _ in rows]
  built = fake_tfds(tmp_path, {"index": tfds.features.Scalar(dtype=np.int64)},
                    {"easy": examples})
  ref = tfds.builder_from_directory(str(built))
  empty = {r[3] for r in rows if r[4]}
  want = {s: sorted(int(r["index"]) for r in ref.as_data_source(split=f"easy[{cut}]")
                    if int(r["index"]) not in empty)
          for s, cut in (("train", ":80%"), ("val", "80%:90%"), ("test", "90%:"))}
  assert want == PINNED_EASY


def test_split_hash_errors(tmp_path):
  _lra_level(tmp_path, per_file=(4,), empty=())
  with pytest.raises(ValueError, match="data.split_hash"):
    pf.load_pathfinder(str(tmp_path), resolution=32, level="easy", seed=0, split_hash="md5")
  with pytest.raises(ValueError, match="data.split_fractions"):
    pf.load_pathfinder(str(tmp_path), resolution=32, level="easy", seed=0, split_hash="lra",
                       split_fractions=(0.805, 0.095, 0.1))
  assert pf.lra_split_bounds(200000, (0.8, 0.1, 0.1)) == (160000, 180000)
  assert pf.lra_split_bounds(25, (0.8, 0.1, 0.1)) == (20, 22)


def test_split_hash_reaches_load_pathfinder(tmp_path):
  _lra_level(tmp_path)
  config = lra.make_config("pathfinder", "softmax", "tiny")
  config.data.data_dir = str(tmp_path)
  config.data.level = "easy"
  config.data.split_hash = "lra"
  with pytest.warns(UserWarning):
    data = tasks.load_task(tasks.data_config(config))
  assert _ids(data.test) == PINNED_EASY["test"]


# ----------------------------------------------------------------------------
# The last partial eval batch.


def _count(n, batch_size, drop, num_batches=-1):
  split = RaggedExamples(tokens=np.ones(n * 4, np.uint8),
                         offsets=np.arange(n + 1, dtype=np.int64) * 4,
                         labels=np.zeros(n, np.int32), explicit_mask=True)
  config = lra.make_config("image", "softmax")
  config.data.drop_last_eval_batch = drop
  found = list(batches.eval_index_batches(
      split, batches.BatchConfig.from_config_dict(config), batch_size, num_batches))
  assert all(len(idx) == batch_size for idx, _ in found)
  kept = np.concatenate([idx[valid] for idx, valid in found]) if found else np.zeros(0)
  assert len(set(kept.tolist())) == len(kept)
  return len(kept), kept


def test_drop_last_eval_batch_counts():
  assert _count(1000, 256, drop=False)[0] == 1000      # default: filler rows of weight 0
  n, kept = _count(1000, 256, drop=True)
  assert n == 768 and sorted(kept.tolist()) == list(range(768))   # the split's tail goes
  assert _count(10000, 256, drop=True)[0] == 9984      # LRA's CIFAR-10 test count
  assert _count(1024, 256, drop=True)[0] == 1024
  assert _count(1000, 256, drop=True, num_batches=2)[0] == 512
  with pytest.raises(ValueError, match="data.drop_last_eval_batch"):
    _count(100, 256, drop=True)
