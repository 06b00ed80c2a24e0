"""``python -m simpletron_jax.data where|prepare|verify`` (issue 47, item 1), on tiny fixtures
laid out as the real releases are: an ``lra_release.gz`` with LRA's member names, CIFAR-10's
python tarball, IMDB's ``aclImdb_v1.tar.gz``, AG News's ``ag_news_csv.tgz``, and a prepared
tfds data dir (``dataset_info.json``) in tfds's default place."""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import signal
import subprocess
import sys
import tarfile
import time

import numpy as np
import pytest

from simpletron_jax.data import tasks
from simpletron_jax.data import __main__ as data_cli
from simpletron_jax.data import (agnews, cifar, image, listops, pathfinder, prepare, retrieval,
                                 sources, text)
from simpletron_jax.runtime import cli
from tests.conftest import ROOT, InterruptedWhileCollected


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
  """``~`` and tfds's default data dir point into the test's folder, so the default places
  (``~/data``, ``~/tensorflow_datasets``) start empty."""
  home = tmp_path / "home"
  home.mkdir()
  monkeypatch.setenv("HOME", str(home))
  monkeypatch.delenv("TFDS_DATA_DIR", raising=False)
  monkeypatch.delenv("SIMPLETRON_JAX_CACHE", raising=False)
  return home


def _tar(path, members: dict[str, bytes]) -> str:
  """A gzipped tar at ``path`` holding ``members`` (name -> bytes), in that order."""
  with tarfile.open(path, "w:gz") as tar:
    for name, data in members.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return str(path)


def _png(value: int) -> bytes:
  from PIL import Image  # pylint: disable=import-outside-toplevel
  buf = io.BytesIO()
  Image.fromarray(np.full((32, 32), value, np.uint8), mode="L").save(buf, format="PNG")
  return buf.getvalue()


LISTOPS_LINES = {"train": ["( ( ( [MAX 2 ) 9 ) ] )\t9", "( ( ( [MIN 4 ) 7 ) ] )\t4",
                           "( ( [SM 3 ) ] )\t3"],
                 "val": ["( ( ( [MED 1 ) 5 ) ] )\t3"], "test": ["( ( [MAX 8 ) ] )\t8"]}
AAN = {"train": [(1, "a1", "a2", "b'first doc'", "b'second doc'"),
                 (0, "a3", "a4", "b'third'", "b'fourth'")],
       "val": [(1.0, "b1", "b2", "b'x'", "b'y'")], "test": [(0.0, "c1", "c2", "b'p'", "b'q'")]}


@pytest.fixture(scope="module")
def lra_archive(tmp_path_factory) -> str:
  """``lra_release.gz``: LRA's member names (a doubly nested ``lra_release/lra_release/`` for
  AAN, as some copies have), a few files of each task, and a member that tries to leave the
  destination."""
  members = {}
  for split, lines in LISTOPS_LINES.items():
    members[f"lra_release/listops-1000/basic_{split}.tsv"] = (
        "Source\tTarget\n" + "\n".join(lines) + "\n").encode()
  for split, name in retrieval.SPLIT_FILES.items():
    members[f"lra_release/lra_release/tsv_data/{name}"] = "".join(
        "\t".join(map(str, row)) + "\n" for row in AAN[split]).encode()
  level = "lra_release/pathfinder32/curv_contour_length_14"
  rows = []
  for j in range(4):
    members[f"{level}/imgs/0/sample_{j}.png"] = _png(40 * j)
    rows.append(f"imgs/0 sample_{j}.png {j} {j % 2} 1 14 3 2 1.5 1 1\n")
  members[f"{level}/metadata/0.npy"] = "".join(rows).encode()
  members["lra_release/pathfinder32/curv_baseline/metadata/0.npy"] = b"imgs/0 x.png 0 1\n"
  members["../escape.txt"] = b"outside"
  return _tar(tmp_path_factory.mktemp("lra") / "lra_release.gz", members)


def _config(task, *overrides, spec=None):
  return prepare.task_config(task, spec, list(overrides))


# ----------------------------------------------------------------------------
# where: the loaders' own search, and one line per missing source.


def test_where_names_the_file_to_fetch_its_address_and_the_command(capsys):
  missing = prepare.where("retrieval", _config("retrieval"))
  assert missing.kind == "missing" and not missing.ready
  line = missing.line()
  assert "\n" not in line
  for part in ("lra_release.gz", "https://storage.googleapis.com/long-range-arena/"
               "lra_release.gz", "prepare --task retrieval --from"):
    assert part in line
  assert "https://s3.amazonaws.com/fast-ai-nlp/ag_news_csv.tgz" in prepare.where(
      "agnews", _config("agnews")).line()
  # The command: one line per task, exit status 0.
  assert data_cli.main(["where", "--task", "retrieval"]) == 0
  assert capsys.readouterr().out.count("\n") == 1
  # verify of a missing source fails with the same line.
  assert data_cli.main(["verify", "--task", "retrieval"]) == 1
  assert capsys.readouterr().out.startswith("FAIL: retrieval: no data found. Fetch "
                                            "lra_release.gz")


def test_where_uses_the_loaders_order_and_finds_tfds_in_its_default_place(tmp_path,
                                                                          monkeypatch):
  # A prepared tfds cifar10 and imdb_reviews, as tfds lays them out, in $TFDS_DATA_DIR.
  tfds_dir = tmp_path / "tfds"
  infos = {"cifar10/3.0.2": {"train": ["30000", "20000"], "test": ["10000"]},
           "imdb_reviews/plain_text/1.0.0": {"train": ["25000"], "test": ["25000"]}}
  for folder, splits in infos.items():
    (tfds_dir / folder).mkdir(parents=True)
    info = {"name": folder.split("/")[0], "splits": [
        {"name": name, "shardLengths": lengths, "numBytes": "1"}
        for name, lengths in splits.items()]}
    (tfds_dir / folder / "dataset_info.json").write_text(json.dumps(info))
  monkeypatch.setenv("TFDS_DATA_DIR", str(tfds_dir))
  config = _config("image")
  assert tasks.default_tfds_data_dir() == str(tfds_dir)
  assert tasks.source_dirs(config, image.TFDS_NAME) == (None, str(tfds_dir))
  found = prepare.where("image", config)
  assert (found.kind, found.path) == ("tfds", str(tfds_dir / "cifar10" / "3.0.2"))
  # verify reads the counts from dataset_info.json (no TensorFlow needed).
  checks = prepare.verify("text", _config("text"))
  assert ("ok", "text train: 25,000 examples, as published") in checks
  assert ("ok", "image train: 50,000 images, as published") in prepare.verify("image", config)
  # An explicit data.data_dir wins over tfds's default place.
  npz_dir = tmp_path / "npz"
  npz_dir.mkdir()
  x = np.zeros((2, 32, 32), np.uint8)
  np.savez(npz_dir / image.NPZ_NAME, x_train=x, y_train=np.zeros(2, np.uint8), x_test=x,
           y_test=np.zeros(2, np.uint8))
  explicit = _config("image", f"--config.data.data_dir={npz_dir}")
  assert tasks.source_dirs(explicit, image.TFDS_NAME) == (str(npz_dir), None)
  assert prepare.where("image", explicit).kind == "npz"
  # ... and data.tfds_data_dir names the tfds folder outright.
  named = _config("text", f"--config.data.tfds_data_dir={tfds_dir}")
  assert prepare.where("text", named).kind == "tfds"


# ----------------------------------------------------------------------------
# LRA's release: retrieval (AAN), ListOps and Pathfinder.


def test_prepare_retrieval_from_lra_release_lands_where_the_loader_looks(lra_archive, tmp_path,
                                                                         _isolated_home):
  found = prepare.prepare("retrieval", _config("retrieval"), lra_archive, log=lambda _: None)
  tsv_dir = _isolated_home / "data" / "lra_release" / "tsv_data"
  assert (found.kind, found.path) == ("tsv", str(tsv_dir))
  assert sorted(os.listdir(tsv_dir)) == sorted([*retrieval.SPLIT_FILES.values(),
                                                prepare.MANIFEST])
  assert not (tmp_path / "escape.txt").exists() and not (_isolated_home / "escape.txt").exists()
  assert not any("escape" in name for _, _, names in os.walk(tmp_path) for name in names)
  # The loader finds it with data.data_dir unset (~/data/lra_release is searched).
  config = _config("retrieval", "--config.model.max_length=16")
  data = tasks.load_task(config)
  assert [len(data.train), len(data.val), len(data.test)] == [2, 1, 1]
  assert data.train.first.labels.tolist() == [1, 0]
  # verify: checksums as made, and counts against the published sizes.
  checks = prepare.verify("retrieval", config, lra_archive)
  assert [c for c in checks if c[1].endswith("SHA-256 as made")] and ("note", (
      f"{lra_archive}: {os.path.getsize(lra_archive)} bytes; no MD5 is published for "
      "lra_release.gz")) in checks
  assert ("FAIL", "retrieval train: 2 examples, the published data has 147,086") in checks
  with open(tsv_dir / retrieval.SPLIT_FILES["val"], "a") as f:
    f.write("0\td1\td2\tb'a'\tb'b'\n")
  changed = prepare.verify("retrieval", config)
  assert any(s == "FAIL" and "new_aan_pairs.eval.tsv" in line and "run prepare again" in line
             for s, line in changed)


def test_prepare_listops_and_pathfinder_from_lra_release(lra_archive, tmp_path):
  dest = tmp_path / "dest"
  found = prepare.prepare("listops", _config("listops"), lra_archive, str(dest),
                          log=lambda _: None)
  folder = dest / "lra_release" / "listops-1000"
  assert (found.kind, found.path) == ("tsv", str(folder))
  assert listops.load_split(str(folder), "train").labels.tolist() == [9, 4, 3]
  checks = prepare.verify("listops", _config("listops", f"--config.data.data_dir={folder}"))
  assert ("FAIL", "listops train: 3 examples, the published data has 96,000") in checks
  found = prepare.prepare("pathfinder", _config("pathfinder"), lra_archive, str(dest),
                          log=lambda _: None)
  level = dest / "lra_release" / "pathfinder32" / "curv_contour_length_14"
  assert found.kind == "lra" and found.path == str(level)
  assert not (dest / "lra_release" / "pathfinder32" / "curv_baseline").exists()  # other level
  assert sorted(os.listdir(level / "imgs" / "0")) == [f"sample_{j}.png" for j in range(4)]
  config = _config("pathfinder", f"--config.data.data_dir={dest / 'lra_release'}")
  splits = pathfinder.load_pathfinder(config.data_dir, resolution=32, level="hard", seed=0,
                                      progress=False)
  assert sum(len(s) for s in splits.values()) == 4
  checks = prepare.verify("pathfinder", config)
  assert ("ok", f"{level}: every listed image is there") in checks
  assert ("note", "pathfinder all: examples per label [2, 2]") in checks
  assert ("note", "pathfinder all: 4 images, the published data has 200,000") in checks
  os.unlink(level / "imgs" / "0" / "sample_3.png")
  assert any(s == "FAIL" and "1 images listed but absent" in line
             for s, line in prepare.verify("pathfinder", config))
  # An already unpacked release is used where it is.
  found = prepare.prepare("listops", _config("listops"), str(dest), log=lambda _: None)
  assert found.path == str(folder)


def test_a_damaged_archive_or_a_wrong_one_is_one_line(tmp_path, capsys):
  bad = tmp_path / "lra_release.gz"
  bad.write_bytes(b"not a tar")
  with pytest.raises(SystemExit) as e:
    data_cli.main(["prepare", "--task", "retrieval", "--from", str(bad)])
  message = str(e.value.code)
  assert message.startswith("python -m simpletron_jax.data: ") and "\n" not in message
  assert "not a readable tar archive" in message
  wrong = _tar(tmp_path / "other.gz", {"something/else.txt": b"x"})
  with pytest.raises(prepare.DataError, match="holds no tsv_data/ files: is it LRA's "
                     "lra_release.gz"):
    prepare.prepare("retrieval", _config("retrieval"), wrong, log=lambda _: None)
  with pytest.raises(SystemExit, match="--from .*nope.tgz: no such file or folder; fetch "
                     "cifar-10-python.tar.gz .* from https://www.cs.toronto.edu/~kriz/"):
    data_cli.main(["prepare", "--task", "image", "--from", str(tmp_path / "nope.tgz")])
  with pytest.raises(SystemExit, match="the config has no field 'data.data_dri' \\(did you "
                     "mean 'data.data_dir'"):
    data_cli.main(["where", "--task", "image", "--config.data.data_dri=/x"])


# ----------------------------------------------------------------------------
# CIFAR-10's python tarball -> the grayscale npz.


def _cifar_tarball(path, per_batch=3, test=4, seed=0, extra_members=None):
  """A ``cifar-10-python.tar.gz`` with the real member names and batch layout (Python
  pickles of dicts with bytes keys), ``per_batch`` images per training batch."""
  rng = np.random.default_rng(seed)
  members, rgb, labels = {}, {"train": [], "test": []}, {"train": [], "test": []}
  names = [*cifar.CIFAR_TRAIN, cifar.CIFAR_TEST]
  for b, name in enumerate(names):
    split = "test" if name == cifar.CIFAR_TEST else "train"
    n = test if split == "test" else per_batch
    planes = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    y = [int(v) for v in rng.integers(0, 10, n)]
    batch = {b"batch_label": f"batch {b}".encode(), b"labels": y, b"data": planes,
             b"filenames": [f"{name}_{i}.png".encode() for i in range(n)]}
    members[f"{cifar.CIFAR_DIR}/{name}"] = pickle.dumps(batch, protocol=2)
    rgb[split].append(planes.reshape(n, 3, 32, 32).transpose(0, 2, 3, 1))
    labels[split] += y
  members[f"{cifar.CIFAR_DIR}/batches.meta"] = pickle.dumps(
      {b"label_names": [c.encode() for c in image.CLASSES]}, protocol=2)
  members[f"{cifar.CIFAR_DIR}/readme.html"] = b"<html></html>"
  members.update(extra_members or {})
  _tar(path, members)
  return {s: (np.concatenate(rgb[s]), np.asarray(labels[s])) for s in rgb}


def test_prepare_image_from_the_cifar_tarball(tmp_path, capsys):
  archive = tmp_path / "cifar-10-python.tar.gz"
  rgb = _cifar_tarball(archive)
  dest = tmp_path / "dest"
  assert data_cli.main(["prepare", "--task", "image", "--from", str(archive), "--dest",
                        str(dest)]) == 0
  out = capsys.readouterr().out
  npz = dest / "cifar10" / image.NPZ_NAME
  assert f"--config.data.data_dir={dest / 'cifar10'}" in out   # not a default place
  arrays = image.read_npz(str(npz))
  with np.load(npz) as z:
    stored = {k: z[k] for k in z.files}
  for split, n in (("train", 15), ("test", 4)):
    order = image.tfds_order(n, split)
    np.testing.assert_array_equal(stored[f"index_{split}"], order)
    images, labels = arrays[split]
    # Pixel for pixel tf.image.rgb_to_grayscale's arithmetic, in tfds's order.
    np.testing.assert_array_equal(images, image.rgb_to_grayscale(rgb[split][0][order]))
    np.testing.assert_array_equal(labels, rgb[split][1][order])
    batch = cifar.CIFAR_TEST if split == "test" else None
    first = int(order[0])
    want = (f"{batch}_{first}.png" if batch else
            f"{cifar.CIFAR_TRAIN[first // 3]}_{first % 3}.png")
    assert stored[f"names_{split}"][0] == want
  assert stored["classes"].tolist() == list(image.CLASSES)
  # In tfds's order, so data.lra_split is LRA's split: no warning, exact members.
  assert image.npz_in_tfds_order(str(npz))
  config = _config("image", f"--config.data.data_dir={dest / 'cifar10'}",
                   "--config.data.val_fraction=0.2", "--config.data.lra_split=True")
  data = tasks.load_task(config)
  assert [len(data.train), len(data.val), len(data.test)] == [12, 3, 4]
  np.testing.assert_array_equal(data.val.labels, arrays["train"][1][12:])
  # verify: the manifest's checksums, the tarball's MD5 against the published one.
  checks = prepare.verify("image", config, str(archive))
  assert checks[0][0] == "FAIL" and "c58f30108f718f92721af3b95e74349a" in checks[0][1]
  assert ("ok", f"{npz}: {os.path.getsize(npz)} bytes, SHA-256 as made") in checks
  assert ("FAIL", "image train: 15 images, the published data has 50,000") in checks
  assert any(line.startswith(f"{npz}: training images in tfds's order") for _, line in checks)


def test_a_cifar_batch_that_runs_code_is_refused(tmp_path):
  class Evil:
    def __reduce__(self):
      return (os.system, ("echo pwned",))
  archive = tmp_path / "cifar-10-python.tar.gz"
  _cifar_tarball(archive, extra_members={f"{cifar.CIFAR_DIR}/test_batch":
                                         pickle.dumps({b"data": Evil()}, protocol=2)})
  with pytest.raises(prepare.DataError, match="test_batch: not a CIFAR-10 python batch .*"
                     "is not allowed"):
    image.cifar_npz(str(archive), str(tmp_path / "out.npz"))
  assert not (tmp_path / "out.npz").exists()


# ----------------------------------------------------------------------------
# IMDB's aclImdb tarball -> the JSON-lines files; AG News's CSV tarball.


def test_prepare_text_from_acl_imdb_matches_the_folder_reader(tmp_path, _isolated_home):
  reviews = {("train", "pos", 3, 9): b"  Great film \xc3\xa9.<br />  ",
             ("train", "pos", 10, 8): b"Loved it",
             ("train", "neg", 2, 1): b"Awful", ("test", "neg", 7, 2): b"Bad\n",
             ("test", "pos", 0, 10): b"Best"}
  members = {f"aclImdb/{s}/{c}/{i}_{r}.txt": body for (s, c, i, r), body in reviews.items()}
  members.update({"aclImdb/train/unsup/0_0.txt": b"unlabelled", "aclImdb/imdb.vocab": b"a\n",
                  "aclImdb/train/labeledBow.feat": b"0 0:1\n"})
  archive = _tar(tmp_path / "aclImdb_v1.tar.gz", members)
  found = prepare.prepare("text", _config("text"), archive, log=lambda _: None)
  out_dir = _isolated_home / "data" / "imdb"
  assert found.kind == "jsonl"
  # The same reviews, labels and bytes as the reader of the unpacked folder gives.
  with tarfile.open(archive) as tar:
    tar.extractall(tmp_path / "unpacked", filter="data")
  for split in ("train", "test"):
    got = text.read_jsonl(str(out_dir / text.JSONL_FILES[split]))
    want = text.read_acl_imdb(str(tmp_path / "unpacked" / "aclImdb"), split)
    assert got[0] == want[0] and got[1].tolist() == want[1].tolist()
  with gzip.open(out_dir / "imdb_train.jsonl.gz", "rt", encoding="utf-8") as f:
    first = json.loads(f.readline())
  assert first == {"id": 2, "rating": 1, "label": 0, "text": "Awful"}
  # Deterministic bytes: preparing again (from the folder this time) gives the same files.
  before = sources.file_digest(str(out_dir / "imdb_test.jsonl.gz"))
  prepare.prepare("text", _config("text"), str(tmp_path / "unpacked"), log=lambda _: None)
  assert sources.file_digest(str(out_dir / "imdb_test.jsonl.gz")) == before
  checks = prepare.verify("text", _config("text", f"--config.data.data_dir={out_dir}"))
  assert ("FAIL", "text train: examples per label [1, 2], the published data has 12,500 "
          "each") in checks


def test_prepare_agnews_from_the_csv_tarball_is_found_without_a_flag(tmp_path):
  rows = '"3","Wall St. Bears","Reuters - Short-sellers"\n"1","Title","Desc"\n'
  archive = _tar(tmp_path / "ag_news_csv.tgz", {
      "ag_news_csv/train.csv": rows.encode(), "ag_news_csv/test.csv": rows.encode(),
      "ag_news_csv/classes.txt": b"World\nSports\nBusiness\nSci/Tech\n",
      "ag_news_csv/readme.txt": b"x"})
  found = prepare.prepare("agnews", _config("agnews"), archive, log=lambda _: None)
  assert found.kind == "csv" and found.path.endswith(os.path.join("data", "ag_news_csv"))
  assert agnews.read_csv(os.path.join(found.path, "train.csv"))[1].tolist() == [2, 0]
  assert agnews.source_dirs(_config("agnews"))[0] == found.path


# ----------------------------------------------------------------------------
# Generated tasks: prepare runs the seeded generator, as training would.


def test_prepare_generates_listops_and_pathfinder_as_training_would(tmp_path):
  cache = tmp_path / "cache"
  overrides = ["--config.data.num_train=6", "--config.data.num_val=2",
               "--config.data.num_test=2", f"--config.data.cache_dir={cache}"]
  config = _config("listops", *overrides, spec="configs/listops/simple.py:tiny")
  assert not prepare.where("listops", config).ready
  found = prepare.prepare("listops", config, num_workers=1, log=lambda _: None)
  assert found.ready and found.kind == "generated"
  # The folder the trainer would use (ensure_generated's), with a manifest.
  assert found.path == listops.ensure_generated(**listops.generator_args(config))
  checks = prepare.verify("listops", config)
  assert ("ok", "listops train: 6 examples, as the config asks") in checks
  assert sum(line.endswith("SHA-256 as made") for _, line in checks) == 3
  with open(os.path.join(found.path, "basic_test.tsv"), "a") as f:
    f.write("( ( [MAX 1 ) ] )\t1\n")
  assert any(s == "FAIL" and "basic_test.tsv" in line for s, line in
             prepare.verify("listops", config))
  pf = _config("pathfinder", "--config.data.num_images=3", "--config.data.generator=solid",
               f"--config.data.cache_dir={cache}")
  found = prepare.prepare("pathfinder", pf, num_workers=1, log=lambda _: None)
  assert found.ready and found.path == pathfinder.ensure_generated(
      **pathfinder.generator_args(pf), num_workers=1, progress=False)
  checks = prepare.verify("pathfinder", pf)
  assert ("ok", "pathfinder all: 3 images, as the config asks") in checks
  assert any(line.endswith("SHA-256 as made") for _, line in checks)
  # Without --config (the published 200,000 images are not there): each set in the cache.
  found = prepare.configs_to_verify("pathfinder", _config("pathfinder",
                                                          f"--config.data.cache_dir={cache}"))
  assert [(c.num_images, c.generator) for c in found] == [(3, "solid")]
  assert prepare.configs_to_verify("pathx", _config("pathx", f"--config.data.cache_dir={cache}")
                                   )[0].num_images == 200000   # none at 128 x 128


# ----------------------------------------------------------------------------
# The command as a user meets it (issue 62, item 3): run as a subprocess, exit status and
# first line checked.


def _command(*args, cache, **popen):
  """``python -m simpletron_jax.data <args>`` with the cache in ``cache``, from the repository
  root (with Python's fault handler on, so that SIGABRT prints every thread's stack)."""
  env = {**os.environ, "SIMPLETRON_JAX_CACHE": str(cache), "TQDM_DISABLE": "1",
         "PYTHONFAULTHANDLER": "1"}
  return subprocess.Popen([sys.executable, "-m", "simpletron_jax.data", *args], cwd=ROOT,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          **popen)


def _finish(process, timeout=120):
  """The exit status and output lines of ``process``. A process still running after
  ``timeout`` seconds fails the test with its signal masks (Linux) and the Python stacks its
  SIGABRT printed."""
  try:
    out, err = process.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    try:
      with open(f"/proc/{process.pid}/status") as f:
        masks = ", ".join(" ".join(line.split()) for line in f
                          if line.startswith(("SigBlk", "SigIgn", "SigCgt")))
    except OSError:
      masks = "(no /proc)"
    process.send_signal(signal.SIGABRT)
    try:
      _, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:   # SIGABRT blocked or ignored: the masks say which
      process.kill()
      _, err = process.communicate()
    pytest.fail(f"still running after {timeout} s; {masks}; its stacks at SIGABRT:\n"
                f"{err[-6000:]}")
  return process.returncode, out.splitlines(), err.splitlines()


def test_where_and_verify_read_what_was_generated(tmp_path, capsys):
  cache = tmp_path / "cache"
  rc, out, _ = _finish(_command("where", "--task", "listops", cache=cache))
  assert rc == 0 and out[0].startswith(f"listops: not generated yet (in {cache / 'listops'}; ")
  # A small :tiny set, as the main job makes :tiny: verify without --config checks it (each
  # size found), the task given as a word or as --task.
  small = [f"--config.data.num_{split}={n}" for split, n in (("train", 6), ("val", 2),
                                                             ("test", 2))]
  config = _config("listops", *small, f"--config.data.cache_dir={cache}",
                   spec="configs/listops/transformer.py:tiny")
  assert prepare.verify("listops", _config("listops", f"--config.data.cache_dir={cache}"))[0][
      1].startswith("listops: not generated yet")
  found = prepare.prepare("listops", config, num_workers=1, log=lambda _: None)
  rc, out, _ = _finish(_command("verify", "listops", cache=cache))
  assert rc == 0 and out[0] == f"note: listops: generated {found.path} (data.seed=0)"
  assert "ok: listops train: 6 examples, as the config asks" in out
  assert data_cli.main(["verify", "--task", "listops"]) == 1   # another cache: nothing there
  capsys.readouterr()
  with pytest.raises(SystemExit) as exit_info:
    data_cli.parse_args(["verify", "text", "--task", "listops"])
  assert exit_info.value.code == 1
  assert capsys.readouterr().err.splitlines() == [
      f"{data_cli.PROGRAM}: two tasks: 'text' and --task 'listops' (see --help)"]


def test_the_package_alone_answers_where_for_every_task_from_outside_the_checkout(tmp_path):
  # A folder holding only the package (no configs/, nothing of the checkout on sys.path), and
  # a working directory outside the checkout: each task's data settings are its record's,
  # and a config file given by path still loads (its ``from configs import lra``).
  alone = tmp_path / "alone"
  alone.mkdir()
  (alone / "simpletron_jax").symlink_to(os.path.join(ROOT, "simpletron_jax"))
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  env = {**os.environ, "PYTHONPATH": str(alone), "SIMPLETRON_JAX_CACHE": str(tmp_path / "cache"),
         "TQDM_DISABLE": "1"}
  tiny = os.path.join(ROOT, "configs", "listops", "transformer.py") + ":tiny"
  commands = {task: ["where", "--task", task] for task in tasks.names()}
  commands["listops :tiny"] = ["where", "--task", "listops", "--config", tiny]
  running = {name: subprocess.Popen([sys.executable, "-m", "simpletron_jax.data", *args],
                                    cwd=elsewhere, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
             for name, args in commands.items()}
  for name, process in running.items():
    rc, out, err = _finish(process)
    task = name.split()[0]
    assert rc == 0 and len(out) == 1 and out[0].startswith(f"{task}: "), (name, out, err)


def test_ctrl_c_during_prepare_is_one_line_exit_130_and_leaves_no_folder(tmp_path):
  cache = tmp_path / "cache"
  process = _command("prepare", "listops", "--workers", "1", "--config.data.num_train=500000",
                     cache=cache)
  deadline = time.monotonic() + 60
  while not _made(cache) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert _made(cache), "the generator never started"
  process.send_signal(signal.SIGINT)
  rc, out, err = _finish(process)
  assert rc == 130, (out, err)
  assert err == ["python -m simpletron_jax.data: interrupted; nothing half-made is left in the "
                 "cache, run the command again to start over"]
  assert not _made(cache)


def _made(cache):
  """What the ListOps generator has made in ``cache``: every entry but the lock file that
  marks a set being made (``<set>.lock``, no data)."""
  return [path for path in cache.glob("listops/*") if path.suffix != ".lock"]


def test_a_ctrl_c_that_python_drops_is_raised_again(monkeypatch):
  """A KeyboardInterrupt raised while a finalizer or a garbage-collector callback runs (JAX's
  ``_xla_gc_callback`` during ListOps generation) is dropped by Python: inside
  ``cli.sigint_raises`` (the data command, ``train.py``) the generators' waits raise it again,
  and Python's report of the dropped one is left out."""
  reported = []
  monkeypatch.setattr(sys, "unraisablehook", lambda lost: reported.append(lost.exc_value))

  previous = signal.signal(signal.SIGINT, signal.default_int_handler)   # as in a terminal
  try:
    with cli.sigint_raises():
      InterruptedWhileCollected()
      with pytest.raises(KeyboardInterrupt):
        cli.raise_if_terminated()
    assert reported == []
    cli.raise_if_terminated()   # forgotten once the block ends
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # a background job's: left ignored
    with cli.sigint_raises():
      assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
  finally:
    signal.signal(signal.SIGINT, previous)
