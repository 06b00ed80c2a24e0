"""Tests for simpletron_jax.data.listops (generator, evaluator, TSV I/O)."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import numpy as np
import pytest

from simpletron_jax.data import listops
from simpletron_jax.data.listops import generate as listops_generate

SMALL = dict(num_train=300, num_val=30, num_test=30, min_length=20, max_length=200)


def _strip(expr: str) -> str:
  return expr.replace("(", "").replace(")", "")


# ----------------------------------------------------------------------------
# Vocabulary and tokenisation.


def test_vocab_is_fixed():
  assert listops.VOCAB == ("<pad>", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9",
                           "[MIN", "[MAX", "[MED", "[SM", "]")
  assert listops.VOCAB_SIZE == len(listops.VOCAB) == 16
  assert listops.PAD_ID == 0 and listops.NUM_CLASSES == 10
  assert tuple(listops.OPERATORS) == ("[MIN", "[MAX", "[MED", "[SM")


def test_tokenize_drops_parentheses():
  ids = listops.tokenize("( ( ( [MAX 2 ) 9 ) ] )")
  assert ids.dtype == np.int32
  np.testing.assert_array_equal(ids, [12, 3, 10, 15])
  np.testing.assert_array_equal(listops.tokenize("[MAX 2 9 ]"), ids)
  np.testing.assert_array_equal(listops.tokenize("[MIN 0 [MED 1 ] [SM 2 ] ]"),
                                [11, 1, 13, 2, 15, 14, 3, 15, 15])


def test_tokenize_unknown_token_is_named():
  with pytest.raises(ValueError, match=r"'\[FIRST'"):
    listops.tokenize("[FIRST 1 2 ]")
  with pytest.raises(ValueError, match="'12'"):
    listops.tokenize("[MAX 12 ]")


# ----------------------------------------------------------------------------
# Labels.

HAND_MADE = [
    ("7", 7),
    ("[MIN 3 1 4 ]", 1),
    ("[MAX 3 1 4 ]", 4),
    ("[MED 3 1 2 ]", 2),
    ("[MED 1 2 3 4 ]", 2),  # int(2.5)
    ("[MED 0 9 ]", 4),  # int(4.5)
    ("[MED 5 6 ]", 5),
    ("[MED 7 7 1 9 ]", 7),
    ("[SM 9 8 7 ]", 4),  # 24 % 10
    ("[SM 5 5 ]", 0),
    ("[SM 1 2 ]", 3),
    ("[MAX [MIN 4 7 ] [SM 9 9 ] 2 ]", 8),
    ("[MED [MAX 1 2 ] [MIN 9 [SM 3 4 ] ] 5 6 ]", 5),  # median of 2, 7, 5, 6 = 5.5
    ("[SM [SM 9 9 9 ] [MAX 0 0 ] [MED 8 9 ] ]", 5),  # 7 + 0 + 8 = 15
]


@pytest.mark.parametrize("expr,label", HAND_MADE)
def test_evaluate_hand_made(expr, label):
  assert listops.evaluate(expr) == label
  with_parens = listops.to_source(listops.tokenize(expr).tolist())
  if expr != "7":
    assert with_parens.startswith("( ")
  assert _strip(with_parens).split() == expr.split()
  assert listops.evaluate(with_parens) == label


def test_evaluate_lra_form():
  assert listops.evaluate("( ( ( [MAX 2 ) 9 ) ] )") == 9
  assert listops.evaluate("( ( ( [SM ( ( ( [MIN 1 ) 2 ) ] ) ) 3 ) ] )") == 4
  assert listops.to_source([12, 3, 10, 15]) == "( ( ( [MAX 2 ) 9 ) ] )"


def test_median_matches_numpy():
  rng = random.Random(0)
  for _ in range(300):
    args = [rng.randrange(10) for _ in range(rng.randint(1, 10))]
    expr = "[MED " + " ".join(map(str, args)) + " ]"
    assert listops.evaluate(expr) == int(np.median(args)), args


def test_evaluate_deep_nesting_without_recursion():
  depth = 5000
  assert listops.evaluate("[SM " * depth + "3 " + "] " * depth) == 3


@pytest.mark.parametrize("expr,message", [
    ("[MAX 1 2 ] ]", "trailing"),
    ("] 1", "unbalanced"),
    ("[MAX ]", "no arguments"),
    ("[MAX 1 2 ] 3", "trailing"),
    ("[MAX 1 [MIN 2 ]", "not closed"),
    ("", "empty"),
    ("( )", "empty"),
    ("[FOO 1 ]", "unknown"),
    ("[MAX 1 x ]", "unknown"),
])
def test_evaluate_malformed(expr, message):
  with pytest.raises(ValueError, match=message):
    listops.evaluate(expr)


# ----------------------------------------------------------------------------
# Generator.


def _reference_value(tree):
  """LRA-style recursive evaluation of a left-nested pair tree (as LRA's to_value)."""
  if not isinstance(tree, tuple):
    return tree
  left, right = _reference_value(tree[0]), _reference_value(tree[1])
  if left in listops.OPERATORS:
    return (left, [right])
  if right == "]":
    op, args = left
    return {"[MIN": min, "[MAX": max, "[MED": lambda a: int(np.median(a)),
            "[SM": lambda a: int(np.sum(a)) % 10}[op](args)
  return (left[0], left[1] + [right])


def _reference_length(tree):
  if isinstance(tree, tuple):
    return _reference_length(tree[0]) + _reference_length(tree[1])
  return 1


def test_evaluate_matches_recursive_reference_on_generated_trees():
  rng = random.Random(1234)
  seen_ops = set()
  for _ in range(400):
    tree, length = listops.generate_tree(rng, 1, 10, 10)
    assert length == _reference_length(tree)
    source = listops.to_string(tree)
    assert listops.evaluate(source) == _reference_value(tree)
    assert len(listops.tokenize(source)) == length
    seen_ops.update(t for t in source.split() if t.startswith("["))
  assert seen_ops == set(listops.OPERATORS)


@pytest.mark.parametrize("max_depth,max_args", [(10, 10), (4, 3), (1, 10), (6, 2)])
def test_fast_sampler_equals_tree_algorithm(max_depth, max_args):
  """The flat sampler makes the same trees from the same random stream."""
  a, b = random.Random(7), random.Random(7)
  for _ in range(500):
    tree, length = listops.generate_tree(a, 1, max_depth, max_args)
    ids = listops.sample_token_ids(b, max_depth, max_args)
    assert len(ids) == length
    assert listops.to_source(ids) == listops.to_string(tree)
  assert a.getstate() == b.getstate()


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory):
  out = tmp_path_factory.mktemp("listops_small")
  paths = listops.generate_dataset(str(out), seed=5, num_workers=1, **SMALL)
  return str(out), paths


def _read_lines(path):
  with open(path, encoding="utf-8") as f:
    return f.read().splitlines()


def test_generated_files(small_dataset):
  out, paths = small_dataset
  assert set(paths) == {"train", "val", "test"}
  sources = []
  for split, n in (("train", 300), ("val", 30), ("test", 30)):
    assert paths[split] == os.path.join(out, f"basic_{split}.tsv")
    lines = _read_lines(paths[split])
    assert lines[0] == "Source\tTarget"
    assert len(lines) == n + 1
    data = listops.load_split(out, split)
    assert len(data) == n
    assert data.tokens.dtype == np.uint8 and data.labels.dtype == np.int32
    assert np.all((data.lengths > 20) & (data.lengths < 200))
    for i, line in enumerate(lines[1:]):
      source, target = line.split("\t")
      assert source.startswith("( ")
      assert int(target) == listops.evaluate(source) == data.labels[i]
      np.testing.assert_array_equal(data.example(i), listops.tokenize(source))
      sources.append(source)
  assert len(set(sources)) == len(sources) == 360
  assert len(set(np.concatenate([listops.load_split(out, s).labels
                                 for s in ("train", "val", "test")]))) > 3


def test_generation_is_deterministic(small_dataset, tmp_path):
  out, paths = small_dataset
  again = listops.generate_dataset(str(tmp_path / "again"), seed=5, num_workers=1, **SMALL)
  for split in paths:
    with open(paths[split], "rb") as f1, open(again[split], "rb") as f2:
      assert f1.read() == f2.read()
  splits = listops.generate_splits(5, num_workers=2, **SMALL)
  for split in paths:
    assert [f"{s}\t{t}" for s, t in splits[split]] == _read_lines(paths[split])[1:]
  other = listops.generate_splits(6, num_workers=1, **SMALL)
  assert other["train"] != splits["train"]


def test_dedup_and_exhaustion():
  # Only the 10 single digits have 0 < length < 2 tokens.
  splits = listops.generate_splits(0, num_train=10, num_val=0, num_test=0, min_length=0,
                                   max_length=2, num_workers=1)
  assert sorted(splits["train"]) == [(str(d), d) for d in range(10)]
  assert splits["val"] == splits["test"] == []
  with pytest.raises(RuntimeError, match="distinct"):
    listops.generate_splits(0, num_train=11, num_val=0, num_test=0, min_length=0,
                            max_length=2, num_workers=1)


def test_impossible_bounds_rejected():
  with pytest.raises(ValueError):
    listops.generate_splits(0, min_length=100, max_length=101)
  with pytest.raises(ValueError):  # longest tree at depth 2 with 3 args is 5 tokens
    listops.generate_splits(0, min_length=5, max_length=100, max_depth=2, max_args=3)
  with pytest.raises(TypeError):
    listops.ensure_generated("/nonexistent", seed=0, bogus=1)


def test_ensure_generated_reuses(tmp_path, monkeypatch):
  cache = str(tmp_path / "cache")
  first = listops.ensure_generated(cache, seed=1, num_workers=1, **SMALL)
  train = os.path.join(first, "basic_train.tsv")
  assert os.path.isfile(os.path.join(first, "basic_meta.json"))
  mtime = os.stat(train).st_mtime_ns

  def fail(*args, **kwargs):
    raise AssertionError("regenerated")

  with monkeypatch.context() as m:
    m.setattr(listops_generate, "generate_dataset", fail)
    assert listops.ensure_generated(cache, seed=1, **SMALL) == first
  assert os.stat(train).st_mtime_ns == mtime
  assert len(listops.load_split(first, "val")) == 30

  other = listops.ensure_generated(cache, seed=2, num_workers=1, **SMALL)
  assert other != first
  # A damaged meta file makes it generate again.
  with open(os.path.join(first, "basic_meta.json"), "w") as f:
    f.write("{")
  calls = []
  real = listops.generate_dataset
  monkeypatch.setattr(listops_generate, "generate_dataset",
                      lambda *a, **k: calls.append(1) or real(*a, **k))
  assert listops.ensure_generated(cache, seed=1, num_workers=1, **SMALL) == first
  assert calls == [1]


# ----------------------------------------------------------------------------
# Loading and writing.


def _write(path, text):
  with open(path, "w", encoding="utf-8", newline="") as f:
    f.write(text)


@pytest.mark.parametrize("text,line,message", [
    ("Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\n", 2, "2 tab-separated fields"),
    ("Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t9\t1\n", 2, "2 tab-separated fields"),
    ("Source\tTarget\n[MAX 2 9 ]\t9\n[MAX 2 9 ]\tnine\n", 3, "not an integer"),
    ("Source\tTarget\n[MAX 2 9 ]\t10\n", 2, "not an integer"),
    ("Source\tTarget\n[MAX 2 9 ]\t9\n[MAX 2 [FIRST 9 ]\t9\n", 3, r"unknown token '\[FIRST'"),
    ("Source\tTarget\n ( ) \t9\n", 2, "empty Source"),
    ("[MAX 2 9 ]\t9\n", 1, "header"),
    ("", 1, "header"),
])
def test_load_split_malformed(tmp_path, text, line, message):
  path = tmp_path / "basic_train.tsv"
  _write(path, text)
  with pytest.raises(ValueError, match=message) as info:
    listops.load_split(str(tmp_path), "train")
  assert str(info.value).startswith(f"{path}:{line}:")


def test_load_split_missing_file(tmp_path):
  with pytest.raises(FileNotFoundError, match="basic_test.tsv") as info:
    listops.load_split(str(tmp_path), "test")
  assert "listops-1000" in str(info.value)
  with pytest.raises(ValueError):
    listops.load_split(str(tmp_path), "validation")


def test_load_split_lra_crlf_file(tmp_path):
  # LRA's csv.writer ended lines with \r\n.
  _write(tmp_path / "basic_val.tsv",
         "Source\tTarget\r\n( ( ( [MAX 2 ) 9 ) ] )\t9\r\n( ( [SM 4 ) ] )\t4\r\n")
  data = listops.load_split(str(tmp_path), "val")
  np.testing.assert_array_equal(data.labels, [9, 4])
  np.testing.assert_array_equal(data.lengths, [4, 3])
  np.testing.assert_array_equal(data.tokens, [12, 3, 10, 15, 14, 5, 15])


def test_write_tsv_is_atomic(tmp_path):
  path = str(tmp_path / "basic_train.tsv")
  assert listops.write_tsv([("( ( ( [MAX 2 ) 9 ) ] )", 9)], path) == 1
  before = open(path, encoding="utf-8").read()
  assert before == "Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t9\n"
  with pytest.raises(ValueError):
    listops.write_tsv([("[MAX 1 2 ]", 2), ("[MAX 1 2 ]", 12)], path)
  assert open(path, encoding="utf-8").read() == before
  assert os.listdir(tmp_path) == ["basic_train.tsv"]


def test_a_script_on_stdin_fails_fast_instead_of_hanging(tmp_path):
  # Spawned workers cannot import a '<stdin>' main module. multiprocessing.Pool restarted
  # them without end (a hang, with the log full of one traceback); the generator must stop
  # with an error that says how to run it.
  script = ("from simpletron_jax.data import listops\n"
            f"listops.generate_dataset({str(tmp_path)!r}, seed=0, num_workers=2, num_train=600, "
            "num_val=0, num_test=0, min_length=20, max_length=200)\n")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  done = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True,
                        timeout=120, cwd=str(tmp_path),
                        env={**os.environ, "PYTHONPATH": root, "JAX_PLATFORMS": "cpu"})
  assert done.returncode != 0
  assert "python -c" in done.stderr and "num_workers=1" in done.stderr, done.stderr[-2000:]
  # One traceback per worker (2) and the chained error in the caller (2), not an endless loop.
  assert done.stderr.count("Traceback") <= 4, done.stderr[-2000:]
