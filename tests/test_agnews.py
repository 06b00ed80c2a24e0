"""The AG News task (issue 30; SimpleTRON section 5.3): the CSV and tfds loaders, BERT's
WordPiece tokenization, truncation, the validation split, and the task through train.py's
registry and the depth script.

``tests/fixtures/agnews/`` holds invented articles in the release's format (``"class",
"title", "description"``, every field quoted; 81 train rows with one 150-word article, 20
test rows), each topic with its own words so that a tiny model learns them, and a 182-token
cased BERT-style ``vocab.txt`` for them (``[PAD]`` at id 0, word pieces ``##s`` etc.).
"""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

from configs import lra
from simpletron_jax.data import agnews, tasks
from tests.conftest import ROOT, fake_tfds

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "agnews")


def load(max_length=128, seed=0, **kwargs):
  return agnews.load_agnews(data_dir=FIXTURES, tfds_data_dir=None, vocab_path=FIXTURES,
                            max_length=max_length, seed=seed, **kwargs)


def decode(tokenizer, ids):
  return [tokenizer.tokenizer.id_to_token(int(i)) for i in ids]


def test_fixture_splits_labels_and_ids():
  splits, tokenizer, truncated = load()
  assert {k: len(v) for k, v in splits.items()} == {"train": 77, "val": 4, "test": 20}
  assert tokenizer.vocab_size == 182 and tokenizer.lowercase is False   # a cased vocabulary
  for name, split in splits.items():
    assert set(np.unique(split.labels)) <= {0, 1, 2, 3}, name
    assert split.tokens.dtype == np.uint16
    assert split.tokens.max() < tokenizer.vocab_size
    for i in range(len(split)):
      words = decode(tokenizer, split.example(i))
      assert words[0] == "[CLS]" and words[-1] == "[SEP]"
      assert 0 not in split.example(i)   # [PAD] never inside an article
  assert np.bincount(splits["test"].labels).tolist() == [5, 5, 5, 5]
  # The first test row: class 2 (Sports), "Oil, gold and stocks: ..." (a quoted comma), the
  # title, a space, then the description.
  texts, labels = agnews.read_csv(os.path.join(FIXTURES, "test.csv"))
  assert texts[0].startswith("Oil, gold and stocks: Says over early over Reuters - with ")
  assert labels[0] == 1 and agnews.CLASSES[labels[0]] == "Sports"
  assert decode(tokenizer, splits["test"].example(0))[1:5] == ["Oil", ",", "gold", "and"]
  # The one 150-word article is cut at 128 tokens and counted, wherever the split put it.
  assert truncated["train"] + truncated["val"] == 1 and truncated["test"] == 0


def test_truncation_keeps_sep_and_is_counted(capsys):
  splits, tokenizer, truncated = load(max_length=12)
  full, _, _ = load(max_length=1000)
  lengths = full["train"].lengths
  assert truncated["train"] == int(np.sum(lengths > 12)) > 0
  assert "model.max_length=12 truncates" in capsys.readouterr().err
  for i in np.flatnonzero(lengths > 12)[:5]:
    cut = splits["train"].example(i)
    assert len(cut) == 12 and cut[-1] == tokenizer.sep_id
    np.testing.assert_array_equal(cut[:11], full["train"].example(i)[:11])
  with pytest.raises(ValueError, match="model.max_length=1"):
    load(max_length=1)


def test_validation_is_a_seeded_five_percent_of_train():
  a, _, _ = load(seed=0)
  b, _, _ = load(seed=0)
  c, _, _ = load(seed=1)
  as_set = lambda split: {tuple(split.example(i)) for i in range(len(split))}  # noqa: E731
  assert as_set(a["val"]) == as_set(b["val"]) != as_set(c["val"])
  assert as_set(a["val"]) | as_set(a["train"]) == as_set(c["val"]) | as_set(c["train"])
  assert not as_set(a["val"]) & as_set(a["train"])
  with pytest.raises(ValueError, match="data.val_fraction"):
    load(val_fraction=0.0)


def test_tokenizer_matches_transformers_bert_tokenizer():
  transformers = pytest.importorskip("transformers")
  texts, _ = agnews.read_csv(os.path.join(FIXTURES, "train.csv"))
  texts = texts[:10] + ["Caf\u00e9 na\u00efve \u00c9lys\u00e9e TEAM Team team's unknownword"]
  for lowercase in (False, True):
    ours = agnews.make_tokenizer(FIXTURES, lowercase=lowercase)
    theirs = transformers.BertTokenizer.from_pretrained(FIXTURES, do_lower_case=lowercase)
    examples, _ = ours.encode(texts, max_length=512)
    for i, text in enumerate(texts):
      assert examples.example(i).tolist() == theirs(text)["input_ids"], (lowercase, text)


def test_lowercase_follows_the_checkpoint(tmp_path):
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nteam\n##s\n")
  assert agnews.make_tokenizer(str(tmp_path)).lowercase is True   # no upper-case word
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
  assert agnews.make_tokenizer(str(tmp_path)).lowercase is False
  assert agnews.make_tokenizer(str(vocab), lowercase=True).lowercase is True
  ids = agnews.make_tokenizer(str(tmp_path), lowercase=True).encode(["Teams"], 8)[0]
  assert ids.example(0).tolist() == [2, 4, 5, 3]


def test_bad_files_are_named(tmp_path):
  bad = tmp_path / "train.csv"
  bad.write_text('"1","a title","a text"\n"5","x","y"\n')
  with pytest.raises(ValueError, match=r"train.csv:2: the class must be 1-4, found '5'"):
    agnews.read_csv(str(bad))
  bad.write_text('"1","only a title"\n')
  with pytest.raises(ValueError, match=r"train.csv:1: expected 3 fields"):
    agnews.read_csv(str(bad))
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("[UNK]\n[PAD]\n[CLS]\n[SEP]\n")
  with pytest.raises(ValueError, match=r"\[PAD\] is id 1; it must be id 0"):
    agnews.make_tokenizer(str(tmp_path))
  vocab.write_text("[PAD]\n[UNK]\n[CLS]\n")
  with pytest.raises(ValueError, match=r"lacks \['\[SEP\]'\]"):
    agnews.make_tokenizer(str(vocab))
  with pytest.raises(FileNotFoundError, match="data.vocab_path="):
    agnews.make_tokenizer(str(tmp_path / "missing"))
  with pytest.raises(FileNotFoundError, match="data.vocab_path is unset"):
    agnews.load_agnews(data_dir=FIXTURES, tfds_data_dir=None, vocab_path=None, max_length=8,
                       seed=0)
  with pytest.raises(FileNotFoundError, match=r"train.csv and test.csv in .*\(data.data_dir\)"):
    agnews.find_source(str(tmp_path), None)
  with pytest.raises(FileNotFoundError, match="data.data_dir and data.tfds_data_dir are unset"):
    agnews.find_source(None, None)


def test_csv_in_an_ag_news_csv_folder(tmp_path):
  (tmp_path / "ag_news_csv").mkdir()
  for name in ("train.csv", "test.csv"):
    (tmp_path / "ag_news_csv" / name).write_text(open(os.path.join(FIXTURES, name)).read())
  kind, where = agnews.find_source(str(tmp_path), None)
  assert kind == "csv" and where["test"] == str(tmp_path / "ag_news_csv" / "test.csv")


def _fake_tfds_ag_news(tmp_path, rows):
  """A prepared tfds ``ag_news_subset`` (array_record) at ``{tmp}/tfds``."""
  tfds = pytest.importorskip("tensorflow_datasets")
  features = {"title": tfds.features.Text(), "description": tfds.features.Text(),
              "label": tfds.features.ClassLabel(names=list(agnews.CLASSES))}

  fake_tfds(tmp_path, features, rows, to=tmp_path / "tfds" / agnews.TFDS_NAME / "1.0.0")
  return str(tmp_path / "tfds")


def test_tfds_ag_news_subset(tmp_path):
  texts, labels = agnews.read_csv(os.path.join(FIXTURES, "train.csv"))
  rows = {"train": [{"title": "Team wins", "description": t, "label": int(l)}
                    for t, l in zip(texts[:40], labels[:40])],
          "test": [{"title": "Oil prices", "description": texts[-1], "label": int(labels[-1])}]}
  tfds_dir = _fake_tfds_ag_news(tmp_path, rows)
  assert agnews.find_source(FIXTURES, tfds_dir)[0] == "tfds"   # tfds first
  splits, tokenizer, _ = agnews.load_agnews(data_dir=None, tfds_data_dir=tfds_dir,
                                            vocab_path=FIXTURES, max_length=512, seed=0)
  assert (len(splits["train"]), len(splits["val"]), len(splits["test"])) == (38, 2, 1)
  expected, _ = tokenizer.encode([f"Oil prices {texts[-1]}"], 512)
  np.testing.assert_array_equal(splits["test"].example(0), expected.example(0))
  assert splits["test"].labels.tolist() == [int(labels[-1])]


def test_load_task_through_the_registry():
  config = lra.make_config("agnews", "simple_resl", "tiny")
  config.data.data_dir = FIXTURES
  config.data.vocab_path = FIXTURES
  data = tasks.load_task(tasks.data_config(config))
  assert (data.vocab_size, data.num_classes) == (182, 4)
  assert "vocab.txt" in data.source and "train.csv" in data.source
  assert max(int(data.train.lengths.max()), int(data.val.lengths.max())) == 64  # max_length
  config.data.vocab_path = None
  with pytest.raises(FileNotFoundError, match="data.vocab_path is unset"):
    tasks.load_task(tasks.data_config(config))


@pytest.mark.slow
def test_depth_grid_runs_on_the_fixtures(tmp_path):
  """Table 2's script on AG News (``--task agnews``): trains, and measures each block's
  ``K^T V`` with BERT's [CLS] as a token, not a prepended vector."""
  spec = importlib.util.spec_from_file_location(
      "exp_depth", os.path.join(ROOT, "scripts", "experiments", "depth.py"))
  depth = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(depth)
  payload = depth.main(["--task", "agnews", "--quick", "--steps", "2", "--eval_every", "1",
                        "--depths", "1", "--seeds", "0", "--out", str(tmp_path / "out"),
                        "--runs", str(tmp_path / "runs"),
                        f"--config.data.data_dir={FIXTURES}",
                        f"--config.data.vocab_path={FIXTURES}",
                        # Each step compiled once, at 64 positions (bucket 0; the bucket of
                        # 32 compiled train and eval steps at 32 and 64), and without dropout's
                        # random bits: this test is about the task and the measurement.
                        "--config.data.bucket=0", "--config.model.dropout_rate=0",
                        "--config.model.attention_dropout_rate=0"])
  assert [(r["attention"], r["num_layers"]) for r in payload["runs"]] == [
      ("softmax", 1), ("simple_resl", 1)]
  for run in payload["runs"]:
    assert 0.0 <= run["test_accuracy"] <= 1.0
    assert len(run["blocks"]) == 1 and run["blocks"][0]["spread"] > 0
  with open(tmp_path / "runs" / "simple_resl_L1_seed0" / "config.json") as f:
    saved = json.load(f)
  assert (saved["task"], saved["model"]["embedding_type"], saved["model"]["emb_dim"]) == (
      "agnews", "bert", 64)

