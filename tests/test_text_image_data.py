"""Tests for simpletron_jax.data.text (IMDB bytes) and simpletron_jax.data.image (CIFAR-10
grayscale): on the real copies where ``python -m simpletron_jax.data prepare`` puts them
(``~/data``, or the folder ``$SIMPLETRON_JAX_TEST_DATA`` names) when present, and on tiny files
and tiny fake tfds data sets written per test."""

from __future__ import annotations

import gzip
import json
import os
import time

import numpy as np
import pytest

from simpletron_jax.data import image, tasks, text
from simpletron_jax.data.common import make_batch
from tests.conftest import fake_tfds

DATA_ROOT = os.path.expanduser(os.environ.get("SIMPLETRON_JAX_TEST_DATA")
                               or tasks.DEFAULT_DATA_ROOT)
IMDB_DIR = os.path.join(DATA_ROOT, "imdb")
CIFAR_NPZ = os.path.join(DATA_ROOT, "cifar10", image.NPZ_NAME)
HAS_IMDB = all(os.path.isfile(os.path.join(IMDB_DIR, f)) for f in text.JSONL_FILES.values())
needs_imdb = pytest.mark.skipif(not HAS_IMDB, reason=f"IMDB copy not found in {IMDB_DIR}")
needs_cifar = pytest.mark.skipif(not os.path.isfile(CIFAR_NPZ),
                                 reason=f"CIFAR-10 copy not found at {CIFAR_NPZ}")
MAX_LENGTH = 1000
LOAD_SECONDS = {}


def _jsonl_records(path):
  with gzip.open(path, "rt", encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


# ----------------------------------------------------------------------------
# Text on the real IMDB copy.


@pytest.fixture(scope="module")
def imdb():
  start = time.perf_counter()
  splits = text.load_text(data_dir=IMDB_DIR, tfds_data_dir=None, max_length=MAX_LENGTH, seed=0,
                          val_fraction=0.0)  # LRA's split: validation is the test split
  LOAD_SECONDS["imdb"] = time.perf_counter() - start
  return splits


@pytest.fixture(scope="module")
def imdb_records():
  return {split: _jsonl_records(os.path.join(IMDB_DIR, name))
          for split, name in text.JSONL_FILES.items()}


@needs_imdb
def test_imdb_counts_labels_and_ids(imdb):
  print(f"load_text: {LOAD_SECONDS['imdb']:.2f} s")
  assert set(imdb) == {"train", "val", "test"}
  assert imdb["val"] is imdb["test"]
  for split in ("train", "test"):
    ex = imdb[split]
    assert len(ex) == 25_000
    np.testing.assert_array_equal(np.bincount(ex.labels, minlength=2), [12_500, 12_500])
    assert ex.tokens.min() >= 1 and ex.tokens.max() <= 256  # no pad id inside an example
    assert ex.lengths.max() == MAX_LENGTH and ex.lengths.min() > 0
    assert not ex.explicit_mask
  assert text.VOCAB_SIZE == 257 and text.NUM_CLASSES == 2


@needs_imdb
def test_imdb_bytes_decode_to_the_review_text(imdb, imdb_records):
  test = imdb["test"]  # the test split keeps the file order
  for i in (0, 1, 777, 12_499, 12_500, 24_999):
    record = imdb_records["test"][i]
    data = record["text"].encode("utf-8")
    assert test.labels[i] == record["label"]
    assert test.lengths[i] == min(len(data), MAX_LENGTH)
    assert (test.example(i).astype(np.int64) - 1).astype(np.uint8).tobytes() == data[:MAX_LENGTH]
    assert text.decode(test.example(i)) == data[:MAX_LENGTH].decode("utf-8", errors="replace")
    if len(data) <= MAX_LENGTH:
      assert text.decode(test.example(i)) == record["text"]
  lengths = np.array([len(r["text"].encode("utf-8")) for r in imdb_records["test"]])
  np.testing.assert_array_equal(test.lengths, np.minimum(lengths, MAX_LENGTH))
  assert (lengths > MAX_LENGTH).sum() > 1000  # truncation happened


@needs_imdb
def test_imdb_train_is_the_seeded_shuffle(imdb, imdb_records):
  train, records = imdb["train"], imdb_records["train"]
  order = np.random.default_rng(0).permutation(len(records))
  assert records[0]["label"] == records[12_499]["label"] == 0  # the file is sorted by label
  assert 0.4 < imdb["train"].labels[:1000].mean() < 0.6
  for k in (0, 1, 5000, 24_999):
    src = records[order[k]]
    assert train.labels[k] == src["label"]
    assert text.decode(train.example(k)) == (
        src["text"].encode()[:MAX_LENGTH].decode("utf-8", errors="replace"))


# ----------------------------------------------------------------------------
# Text on small files.


def _write_jsonl(folder, rows_by_split, compress=True):
  folder.mkdir(parents=True, exist_ok=True)
  for split, rows in rows_by_split.items():
    name = text.JSONL_FILES[split] if compress else text.JSONL_FILES[split][:-3]
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    (folder / name).write_bytes(gzip.compress(body) if compress else body)
  return str(folder)


def _rows(n, offset=0):
  return [{"id": i, "rating": 1, "label": i % 2, "text": f"review {i + offset} \u00e9\u00e8"}
          for i in range(n)]


def test_encode_decode_round_trip():
  s = "caf\u00e9 <br />\u2603 \x00end"
  ids = text.encode(s)
  assert ids.dtype == np.int32 and ids.min() >= 1 and ids.max() <= 256
  assert ids.tolist() == [b + 1 for b in s.encode("utf-8")]
  assert text.decode(ids) == s
  assert text.decode(np.concatenate([ids, np.zeros(5, np.int32)])) == s  # pads dropped
  assert text.decode(text.encode(s, max_length=4)) == "caf\ufffd"  # a cut 2-byte character
  with pytest.raises(ValueError, match="0..256"):
    text.decode([257])


def test_jsonl_seed_and_truncation(tmp_path):
  data_dir = _write_jsonl(tmp_path / "imdb", {"train": _rows(40), "test": _rows(6, 100)})
  a, b, c = (text.load_text(data_dir=data_dir, tfds_data_dir=None, max_length=9, seed=seed,
                            val_fraction=0.0) for seed in (1, 1, 2))
  np.testing.assert_array_equal(a["train"].tokens, b["train"].tokens)
  assert not np.array_equal(a["train"].tokens, c["train"].tokens)

  def cut(s):
    return s.encode()[:9].decode("utf-8", errors="replace")

  assert sorted(text.decode(a["train"].example(i)) for i in range(40)) == sorted(
      cut(r["text"]) for r in _rows(40))
  assert [text.decode(a["test"].example(i)) for i in range(6)] == [
      cut(r["text"]) for r in _rows(6, 100)]
  plain = _write_jsonl(tmp_path / "plain", {"train": _rows(3), "test": _rows(2)}, compress=False)
  long = text.load_text(data_dir=plain, tfds_data_dir=None, max_length=100, seed=0,
                        shuffle_train=False)
  assert text.decode(long["train"].example(2)) == "review 2 \u00e9\u00e8"
  np.testing.assert_array_equal(long["train"].labels, [0, 1, 0])


def test_text_validation_is_a_seeded_holdout_of_train(tmp_path):
  data_dir = _write_jsonl(tmp_path / "imdb", {"train": _rows(40), "test": _rows(6, 100)})
  out = text.load_text(data_dir=data_dir, tfds_data_dir=None, max_length=20, seed=3)
  assert [len(out[s]) for s in ("train", "val", "test")] == [36, 4, 6]
  assert out["val"] is not out["test"]

  def reviews(split):
    return [(text.decode(split.example(i)), int(split.labels[i])) for i in range(len(split))]

  held, kept = reviews(out["val"]), reviews(out["train"])
  assert sorted(held + kept) == sorted((r["text"], r["label"]) for r in _rows(40))
  again = text.load_text(data_dir=data_dir, tfds_data_dir=None, max_length=20, seed=3)
  assert reviews(again["val"]) == held
  other = text.load_text(data_dir=data_dir, tfds_data_dir=None, max_length=20, seed=4)
  assert sorted(reviews(other["val"])) != sorted(held)
  lra = text.load_text(data_dir=data_dir, tfds_data_dir=None, max_length=20, seed=3,
                       val_fraction=0.0)
  assert lra["val"] is lra["test"] and len(lra["train"]) == 40
  with pytest.raises(ValueError, match="data.val_fraction"):
    text.load_text(data_dir=data_dir, tfds_data_dir=None, max_length=20, seed=3,
                   val_fraction=1.5)


@pytest.mark.parametrize("line,match", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"label": 1}', "field 'text' must be a string"),
    ('{"text": "x", "label": 2}', "field 'label' must be 0 or 1"),
    ('{"text": "x", "label": true}', "field 'label' must be 0 or 1"),
])
def test_malformed_jsonl_names_file_and_line(tmp_path, line, match):
  data_dir = _write_jsonl(tmp_path, {"train": _rows(3), "test": _rows(2)})
  path = os.path.join(data_dir, text.JSONL_FILES["test"])
  good = json.dumps(_rows(1)[0])
  with open(path, "wb") as f:
    f.write(gzip.compress(f"{good}\n\n{line}\n{good}\n".encode()))
  with pytest.raises(ValueError, match=f"{path}:3: {match}"):
    text.load_text(data_dir=data_dir, tfds_data_dir=None, max_length=10, seed=0)


def test_acl_imdb_folder(tmp_path):
  root = tmp_path / "aclImdb"
  files = {("train", "pos", "10_9.txt"): b"  great film\n", ("train", "pos", "2_8.txt"): b"good",
           ("train", "neg", "5_1.txt"): b"bad \xc3\xa9", ("test", "neg", "0_2.txt"): b"meh",
           ("test", "pos", "1_7.txt"): b"\tfine ", ("train", "unsup", "0_0.txt"): b"ignored"}
  for parts, data in files.items():
    (root / parts[0] / parts[1]).mkdir(parents=True, exist_ok=True)
    (root / parts[0] / parts[1] / parts[2]).write_bytes(data)
  for data_dir in (tmp_path, root):
    out = text.load_text(data_dir=str(data_dir), tfds_data_dir=None, max_length=50, seed=0,
                         shuffle_train=False)
    # neg first, then pos ordered by numeric id; whitespace stripped as tfds does.
    assert [text.decode(out["train"].example(i)) for i in range(3)] == [
        "bad \u00e9", "good", "great film"]
    np.testing.assert_array_equal(out["train"].labels, [0, 1, 1])
    assert [text.decode(out["test"].example(i)) for i in range(2)] == ["meh", "fine"]


def test_text_not_found_names_the_config_field(tmp_path):
  with pytest.raises(FileNotFoundError, match="data.data_dir") as e:
    text.load_text(data_dir=str(tmp_path), tfds_data_dir=str(tmp_path), max_length=10, seed=0)
  message = str(e.value)
  assert "imdb_train.jsonl.gz" in message and "aclImdb" in message
  assert "imdb_reviews/plain_text" in message and str(tmp_path) in message


# ----------------------------------------------------------------------------
# Fake tfds data sets (array_record, readable without TensorFlow).


def _prepare_fake_tfds(tmp_path, name, config, features, splits):
  """Writes a tiny prepared tfds data set and moves it to ``{tmp}/tfds/{name}[/{config}]``."""
  target = fake_tfds(tmp_path, features, splits, config,
                     to=tmp_path / "tfds" / name / (config or "") / "1.0.0")
  for decoy in ("0.9.0", "incomplete.ABC_2.0.0"):  # older or unfinished: must not be picked
    (target.parent / decoy).mkdir()
    (target.parent / decoy / "dataset_info.json").write_text("{}")
  return str(tmp_path / "tfds")


def test_text_from_fake_tfds(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  rows = {s: [{"text": f"{s} review {i} \u00e9", "label": i % 2} for i in range(n)]
          for s, n in (("train", 6), ("test", 4))}
  features = {"text": tfds.features.Text(), "label": tfds.features.ClassLabel(names=["neg", "pos"])}
  tfds_dir = _prepare_fake_tfds(tmp_path, "imdb_reviews", "plain_text", features, rows)
  assert text.find_source(str(tmp_path / "nothing"), tfds_dir)[0] == "tfds"
  out = text.load_text(data_dir=str(tmp_path / "nothing"), tfds_data_dir=tfds_dir,
                       max_length=100, seed=0, val_fraction=0.0)
  for split in ("train", "test"):
    got = sorted((text.decode(out[split].example(i)), int(out[split].labels[i]))
                 for i in range(len(out[split])))
    assert got == sorted((r["text"], r["label"]) for r in rows[split])


def test_image_from_fake_tfds(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  rng = np.random.default_rng(0)
  rows = {s: [{"image": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), "label": i % 10}
              for i in range(n)] for s, n in (("train", 20), ("test", 10))}
  features = {"image": tfds.features.Tensor(shape=(32, 32, 3), dtype=np.uint8),
              "label": tfds.features.ClassLabel(names=list(image.CLASSES))}
  tfds_dir = _prepare_fake_tfds(tmp_path, "cifar10", None, features, rows)
  out = image.load_image(data_dir=None, tfds_data_dir=tfds_dir, seed=0)
  assert [len(out[s]) for s in ("train", "val", "test")] == [18, 2, 10]

  def pairs(examples):
    return sorted((examples.example(i).tobytes(), int(examples.labels[i]))
                  for i in range(len(examples)))

  def expected(split):
    return sorted((image.rgb_to_grayscale(r["image"]).tobytes(), r["label"]) for r in rows[split])

  assert sorted(pairs(out["train"]) + pairs(out["val"])) == expected("train")
  assert pairs(out["test"]) == expected("test")


# ----------------------------------------------------------------------------
# Image on the real CIFAR-10 copy.


@pytest.fixture(scope="module")
def cifar():
  start = time.perf_counter()
  splits = image.load_image(data_dir=os.path.dirname(CIFAR_NPZ), tfds_data_dir=None, seed=0)
  LOAD_SECONDS["cifar"] = time.perf_counter() - start
  with np.load(CIFAR_NPZ) as z:
    raw = {k: z[k] for k in ("x_train", "y_train", "x_test", "y_test")}
  return splits, raw


@needs_cifar
def test_cifar_counts_and_split(cifar):
  print(f"load_image: {LOAD_SECONDS['cifar']:.2f} s")
  splits, raw = cifar
  assert [len(splits[s]) for s in ("train", "val", "test")] == [45_000, 5_000, 10_000]
  train_idx, val_idx = image.split_train_val(50_000, 0.1, seed=0)
  assert len(np.intersect1d(train_idx, val_idx)) == 0
  np.testing.assert_array_equal(np.union1d(train_idx, val_idx), np.arange(50_000))
  other_train, _ = image.split_train_val(50_000, 0.1, seed=1)
  assert not np.array_equal(train_idx, other_train)
  for split, idx in (("train", train_idx), ("val", val_idx)):
    np.testing.assert_array_equal(splits[split].tokens.reshape(-1, 32, 32), raw["x_train"][idx])
    np.testing.assert_array_equal(splits[split].labels, raw["y_train"][idx])
  lra_train, lra_val = image.split_train_val(50_000, 0.1, seed=0, lra_split=True)
  np.testing.assert_array_equal(lra_val, np.arange(45_000, 50_000))
  assert len(lra_train) == 45_000


@needs_cifar
def test_cifar_tokens_are_pixels_row_major(cifar):
  splits, raw = cifar
  test = splits["test"]
  assert test.tokens.dtype == np.uint8 and test.explicit_mask
  np.testing.assert_array_equal(test.lengths, np.full(10_000, 1024))
  rng = np.random.default_rng(0)
  for i, r, c in zip(rng.integers(0, 10_000, 50), rng.integers(0, 32, 50),
                     rng.integers(0, 32, 50)):
    assert test.example(i)[32 * r + c] == raw["x_test"][i, r, c]
  np.testing.assert_array_equal(test.labels, raw["y_test"])
  np.testing.assert_array_equal(np.bincount(test.labels, minlength=10), np.full(10, 1000))
  train_and_val = np.concatenate([splits["train"].labels, splits["val"].labels])
  np.testing.assert_array_equal(np.bincount(train_and_val, minlength=10), np.full(10, 5000))
  assert test.tokens.min() == 0 and test.tokens.max() == 255
  assert image.VOCAB_SIZE == 256 and image.NUM_CLASSES == 10 and len(image.CLASSES) == 10


@needs_cifar
def test_cifar_black_pixels_stay_real_in_batches(cifar):
  splits, _ = cifar
  test = splits["test"]
  has_black = np.flatnonzero((test.tokens.reshape(-1, 1024) == 0).any(axis=1))
  assert len(has_black) > 0
  batch = make_batch(test, has_black[:8], max_length=1024, bucket=0)
  assert batch["inputs"].shape == (len(has_black[:8]), 1024)
  assert (batch["inputs"] == 0).any()
  assert batch["mask"].all()


# ----------------------------------------------------------------------------
# Image: conversion and errors.


def test_rgb_to_grayscale_matches_tf_rounding():
  cases = {(0, 0, 0): 0, (255, 255, 255): 255, (255, 0, 0): 76, (0, 0, 255): 29,
           (0, 255, 0): 149}  # floor(255.5 * 0.587) = 149; round(255 * 0.587) would be 150
  rgb = np.array(list(cases), np.uint8)
  assert image.rgb_to_grayscale(rgb).tolist() == list(cases.values())
  # A float64 reference of TF's formula, away from float32 ties.
  rgb = np.random.default_rng(0).integers(0, 256, (200_000, 3), dtype=np.uint8)
  ref = 255.5 * (rgb / 255.0) @ np.array([0.2989, 0.5870, 0.1140])
  away = np.abs(ref - np.round(ref)) > 1e-3
  got = image.rgb_to_grayscale(rgb)
  np.testing.assert_array_equal(got[away], np.floor(ref[away]).astype(np.uint8))
  assert away.mean() > 0.99
  assert image.rgb_to_grayscale(np.zeros((2, 32, 32, 3), np.uint8)).shape == (2, 32, 32)
  with pytest.raises(ValueError, match="uint8 RGB"):
    image.rgb_to_grayscale(np.zeros((4, 3), np.float32))


def test_image_npz_errors_and_val_fraction(tmp_path):
  x = np.zeros((10, 32, 32), np.uint8)
  y = np.arange(10, dtype=np.uint8)
  good = tmp_path / image.NPZ_NAME
  np.savez(good, x_train=x, y_train=y, x_test=x[:4], y_test=y[:4])
  out = image.load_image(data_dir=str(tmp_path), tfds_data_dir=None, seed=0, val_fraction=0.2)
  assert [len(out[s]) for s in ("train", "val", "test")] == [8, 2, 4]
  assert make_batch(out["test"], np.arange(4), max_length=1024, bucket=0)["mask"].all()
  for bad in (0.0, 1.0, -0.1):
    with pytest.raises(ValueError, match="data.val_fraction"):
      image.load_image(data_dir=str(good), tfds_data_dir=None, seed=0, val_fraction=bad)
  broken = tmp_path / "broken.npz"
  np.savez(broken, x_train=x, y_train=y + 1, x_test=x[:4], y_test=y[:4])
  with pytest.raises(ValueError, match=f"{broken}.*labels must lie in 0..9"):
    image.load_image(data_dir=str(broken), tfds_data_dir=None, seed=0)
  np.savez(broken, x_train=x.astype(np.int32), y_train=y, x_test=x[:4], y_test=y[:4])
  with pytest.raises(ValueError, match="uint8 images"):
    image.load_image(data_dir=str(broken), tfds_data_dir=None, seed=0)
  np.savez(broken, x_train=x, y_train=y)
  with pytest.raises(ValueError, match="missing array.*x_test"):
    image.load_image(data_dir=str(broken), tfds_data_dir=None, seed=0)
  with pytest.raises(FileNotFoundError, match="data.data_dir"):
    image.load_image(data_dir=str(tmp_path / "none"), tfds_data_dir=str(tmp_path), seed=0)


def test_tfds_order_is_tfds_storage_order_and_an_npz_in_it_gives_lras_split(tmp_path, caplog):
  hashing = pytest.importorskip("tensorflow_datasets.core.hashing")
  for split, n in (("train", 3000), ("test", 500)):
    hasher = hashing.Hasher(split)   # tfds's writer sorts a split by this hash of the key
    assert image.tfds_order(n, split).tolist() == sorted(range(n), key=hasher.hash_key)
  # An npz whose index_train is that order: lra_split is exact, so no warning.
  n = 20
  x = np.arange(n * 1024, dtype=np.int64).reshape(n, 32, 32).astype(np.uint8)
  y = (np.arange(n) % 10).astype(np.uint8)
  ordered = tmp_path / "ordered"
  ordered.mkdir()
  np.savez(ordered / image.NPZ_NAME, x_train=x, y_train=y, x_test=x[:4], y_test=y[:4],
           index_train=image.tfds_order(n, "train"), index_test=image.tfds_order(4, "test"))
  assert image.npz_in_tfds_order(str(ordered / image.NPZ_NAME))
  with caplog.at_level("WARNING"):
    out = image.load_image(data_dir=str(ordered), tfds_data_dir=None, seed=0, lra_split=True)
  assert "LRA's split sizes, not its members" not in caplog.text
  np.testing.assert_array_equal(out["val"].labels, y[18:])
  # Without the index (another order): the warning says the members are not LRA's.
  plain = tmp_path / "plain"
  plain.mkdir()
  np.savez(plain / image.NPZ_NAME, x_train=x, y_train=y, x_test=x[:4], y_test=y[:4])
  assert not image.npz_in_tfds_order(str(plain / image.NPZ_NAME))
  with caplog.at_level("WARNING"):
    image.load_image(data_dir=str(plain), tfds_data_dir=None, seed=0, lra_split=True)
  assert "LRA's split sizes, not its members" in caplog.text

