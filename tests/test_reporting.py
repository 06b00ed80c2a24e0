"""Reporting: both test protocols in results.json, the multi-seed runner (resuming a killed
seed), and the comparison with the published numbers (from fixture runs)."""

import json
import os
import re
import subprocess
import sys

import jax
import matplotlib.image
import numpy as np
import pytest

from configs import lra
from simpletron_jax.data import batches, tasks
from simpletron_jax.model import attention
from simpletron_jax.tools import published, reporting
from simpletron_jax.train import checkpoints, evaluation, steps, trainer
from simpletron_jax.run import run_record, software_record
from tests.test_train import Killed, _state, tiny_config

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts"))
import compare  # noqa: E402  pylint: disable=wrong-import-position
import seeds  # noqa: E402  pylint: disable=wrong-import-position

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "reporting_runs")


def _config():
  return tiny_config(num_train_steps=5, checkpoint_every=2, eval_frequency=2, warmup=2,
                     **{"model.num_layers": 1, "model.max_length": 24, "data.bucket": 0})


@pytest.fixture(scope="module")
def seed_runs(presence_task, tmp_path_factory):
  """Seed 0 finished (a results.json), seed 1 killed after step 3, then ``run_seeds``."""
  root = str(tmp_path_factory.mktemp("seeds"))
  os.makedirs(seeds.seed_dir(root, 0))
  finished = {"test_accuracy": 0.5, "test_accuracy_best_val": 0.5, "test_accuracy_final": 0.25}
  for name, content in (("results.json", finished), ("config.json", {"seed": 0})):
    with open(os.path.join(seeds.seed_dir(root, 0), name), "w") as f:
      json.dump(content, f)
  open(os.path.join(seeds.seed_dir(root, 0), "metrics.jsonl"), "w").close()
  calls, steps_seen = [], []

  def train(seed, workdir, step_hook=None):
    config = _config()
    config.seed = seed
    calls.append(seed)
    trainer.train_and_evaluate(config, workdir, step_hook=step_hook, data=presence_task)

  def kill_at_3(step):
    if step == 3:
      raise Killed()

  with pytest.raises(Killed):
    train(1, seeds.seed_dir(root, 1), kill_at_3)
  states = [seeds.seed_state(seeds.seed_dir(root, s)) for s in (0, 1, 2)]
  calls.clear()
  results = seeds.run_seeds([0, 1], root, lambda s, w: train(s, w, steps_seen.append),
                            log=lambda _: None)
  summary = seeds.write_summary(results, root, "presence")
  return {"root": root, "states": states, "calls": calls, "steps_seen": steps_seen,
          "results": results, "summary": summary}


@pytest.mark.slow
def test_results_json_scores_the_final_and_the_best_validation_parameters(seed_runs,
                                                                          presence_task):
  workdir = seeds.seed_dir(seed_runs["root"], 1)
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  config = _config()
  model, fresh = _state(config, presence_task)
  _, p_eval = steps.pmap_steps(model.apply)
  manager = checkpoints.checkpoint_manager(os.path.join(workdir, "checkpoints"), None)
  for which, key, step_key in (("latest", "final", "final_step"),
                               ("best", "best_val", "best_step")):
    step = checkpoints.pick_step(manager, which, workdir)
    state, _, step = checkpoints.restore_checkpoint(manager, fresh, step)
    assert step == results[step_key]
    test = evaluation.evaluate(p_eval, steps.replicate(state.params),
                               presence_task.test, batches.BatchConfig.from_config_dict(config))
    assert results[f"test_accuracy_{key}"] == test["accuracy"]
    assert results[f"test_loss_{key}"] == pytest.approx(test["loss"])
  assert results["final_step"] == 5
  # No alias keys; the readers take an older file's test_accuracy as the best-validation one.
  assert not {"test_accuracy", "test_loss", "last_step"} & set(results)
  old = {**results, "test_accuracy": results.pop("test_accuracy_best_val")}
  assert reporting.protocol_accuracy(old, "best_val") == old["test_accuracy"]
  assert run_record.results_problem(old) is None


@pytest.mark.slow
def test_seeds_runner_resumes_the_killed_seed_and_skips_the_finished_one(seed_runs):
  assert seed_runs["states"] == ["done", "resume", "new"]
  assert seed_runs["calls"] == [1], "only the killed seed trains again"
  assert seed_runs["steps_seen"] == [3, 4, 5], "seed 1 resumes after its step-2 checkpoint"
  for seed in (0, 1):
    with open(os.path.join(seeds.seed_dir(seed_runs["root"], seed), "results.json")) as f:
      assert json.load(f) == seed_runs["results"][seed]


@pytest.mark.slow
def test_seed_summary_has_mean_std_and_best_for_both_protocols(seed_runs):
  summary, results = seed_runs["summary"], seed_runs["results"]
  for protocol, key in reporting.PROTOCOL_KEYS.items():
    acc = np.array([100 * results[s][key] for s in (0, 1)])
    assert summary[protocol]["mean"] == pytest.approx(acc.mean())
    assert summary[protocol]["std"] == pytest.approx(acc.std(ddof=1))
    assert summary[protocol]["best"] == pytest.approx(acc.max())
  with open(os.path.join(seed_runs["root"], "summary.json")) as f:
    assert json.load(f)["final"]["n"] == 2
  with open(os.path.join(seed_runs["root"], "summary.md")) as f:
    text = f.read()
  assert text.count("\n| ") == 6  # header, seeds 0 and 1, mean, best, range
  low, high = sorted(100 * results[s]["test_accuracy_final"] for s in (0, 1))
  assert text.splitlines()[-1].endswith(f" | {low:.2f} to {high:.2f} |")


@pytest.mark.slow
def test_copy_runs_leaves_checkpoints_behind(seed_runs, tmp_path):
  seeds.copy_runs([0, 1], seed_runs["root"], str(tmp_path))
  copied = sorted(os.path.relpath(os.path.join(d, n), tmp_path)
                  for d, _, names in os.walk(tmp_path) for n in names)
  assert copied == sorted(["summary.json", "summary.md"] +
                          [f"seed{s}/{n}" for s in (0, 1) for n in seeds.RUN_FILES])


def test_seeds_cli_passes_only_config_overrides():
  with pytest.raises(SystemExit):
    seeds.main(["--config", "configs/listops/simple.py:tiny", "--seeds", "0", "--steps=3"])


def test_find_runs_groups_seed_folders_by_parent():
  groups = {g.label: g for g in reporting.find_runs(FIXTURES)}
  assert sorted(groups) == ["listops_linear_old", "listops_simple", "text_transformer_lra"]
  assert sorted(groups["listops_simple"].results) == [0, 1, 2]
  assert groups["text_transformer_lra"].attention == "softmax"
  assert sorted(groups["text_transformer_lra"].results) == [3]


def test_find_runs_rejects_a_group_that_mixes_tasks(tmp_path):
  for seed, task in ((0, "listops"), (1, "text")):
    run = tmp_path / "mixed" / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"task": task, "model": {"attention": "simple"}}))
    (run / "results.json").write_text(json.dumps({"test_accuracy": 0.5}))
  with pytest.raises(ValueError, match="seed1/config.json"):
    reporting.find_runs(str(tmp_path))


def _fixture_accuracies(label, key):
  accs = []
  for folder, _, files in os.walk(os.path.join(FIXTURES, label)):
    if "results.json" in files:
      with open(os.path.join(folder, "results.json")) as f:
        accs.append(100 * json.load(f)[key])
  return np.array(accs)


def test_comparison_matches_each_publication_protocol():
  rows = {r["label"]: r for r in reporting.comparison_rows(reporting.find_runs(FIXTURES))}
  simple = rows["listops_simple"]
  best_val = _fixture_accuracies("listops_simple", "test_accuracy_best_val")
  assert simple["published"] == published.lookup("simple", "listops").accuracy == 37.45
  assert simple["ours"] == pytest.approx(best_val.max())  # paper: best seed, best val
  assert simple["gap"] == pytest.approx(best_val.max() - 37.45)
  softmax = rows["text_transformer_lra"]
  final = _fixture_accuracies("text_transformer_lra", "test_accuracy_final")
  assert softmax["ours"] == pytest.approx(final.mean())  # LRA: final parameters
  assert softmax["gap"] == pytest.approx(final.mean() - 64.27)
  old = rows["listops_linear_old"]
  assert "final" not in old["summary"] and old["ours"] is None and old["gap"] is None


def test_compare_script_writes_markdown_with_gaps_and_a_png(tmp_path):
  text = compare.main([FIXTURES, "--out", str(tmp_path)])
  rows = {r["label"]: r for r in reporting.comparison_rows(reporting.find_runs(FIXTURES))}
  compared = text.split(reporting.NOT_COMPARED_HEADING)[0]
  # The two fixture groups written at a published cell's size, length and protocol get gaps.
  for label in ("listops_simple", "text_transformer_lra"):
    assert f"| {label} |" in compared and compared.count(f"{rows[label]['gap']:+.2f} |") == 1
  # The old run (no final-step accuracy, a config.json without the model's sizes) gets none.
  old = next(line for line in text.splitlines() if line.startswith("| listops_linear_old |"))
  assert old not in compared and "published" in old and not re.search(r"\| [+-]\d", old)
  with open(tmp_path / "comparison.md") as f:
    assert f.read() == text
  # Beside each group, the software its runs were computed with (the fixtures predate it).
  assert "Software of each group (from its results.json):" in text
  assert "- listops_simple: not recorded (" in text
  image = matplotlib.image.imread(tmp_path / "comparison.png")
  assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def _write_user_run(folder, config, best_val, final, rehearsal=False):
  """A finished run as train.py leaves it: ``config.json`` and a ``results.json`` of that
  config (its fingerprint, every step); ``rehearsal``: reproduce.py's ``reproduce.json``."""
  os.makedirs(folder)
  with open(os.path.join(folder, "config.json"), "w") as f:
    f.write(config.to_json_best_effort())
  results = {"task": config.task, "attention": config.model.attention,
             "test_accuracy": best_val, "test_accuracy_best_val": best_val,
             "test_accuracy_final": final, "final_step": config.num_train_steps,
             "num_train_steps": config.num_train_steps, "complete": True,
             "config_fingerprint": run_record.config_fingerprint(config)}
  with open(os.path.join(folder, "results.json"), "w") as f:
    json.dump(results, f)
  if rehearsal:
    with open(os.path.join(folder, "reproduce.json"), "w") as f:
      json.dump({"cell": "listops_simple", "rehearsal": True}, f)


@pytest.fixture(scope="module")
def user_runs(tmp_path_factory):
  """Runs of four kinds in one folder: LRA's Transformer on ListOps at the published cell
  (``:lra_code``, two seeds), SimpleTRON's ``simple`` at ``:tiny`` (two seeds), a
  ``reproduce.py --rehearse`` run, and ``simple`` at the paper's size for fewer steps."""
  root = str(tmp_path_factory.mktemp("user_runs"))
  for seed, final in ((0, 0.36), (1, 0.38)):
    config = lra.make_config("listops", "softmax", "lra_code")
    config.seed = seed
    _write_user_run(os.path.join(root, "lra_transformer", f"seed{seed}"), config, 0.3, final)
  for seed in (0, 1):
    config = lra.make_config("listops", "simple", "tiny")
    config.seed = seed
    _write_user_run(os.path.join(root, "simple_tiny", f"seed{seed}"), config, 0.389, 0.38)
  config = lra.make_config("listops", "simple", "tiny_authors")
  config.num_train_steps, config.data.num_test = 4, 32
  _write_user_run(os.path.join(root, "rehearsal"), config, 0.25, 0.25, rehearsal=True)
  config = lra.make_config("listops", "simple")
  config.num_train_steps = 100
  _write_user_run(os.path.join(root, "simple_100_steps"), config, 0.2, 0.2)
  return root


def test_compare_gives_a_gap_only_at_the_published_size_length_and_protocol(user_runs,
                                                                            tmp_path):
  proc = subprocess.run([sys.executable, "scripts/compare.py", user_runs, "--out",
                         str(tmp_path), "--no_plot"], cwd=ROOT, capture_output=True,
                        text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]   # runs without a gap are not errors
  text = proc.stdout
  assert text.strip() == (tmp_path / "comparison.md").read_text().strip()
  compared, other = text.split(f"### {reporting.NOT_COMPARED_HEADING}")
  rows = {line.split(" | ")[0][2:]: line for line in text.splitlines()
          if line.startswith("| ") and not line.startswith("| run ")}
  # The published cell: LRA's protocol (mean of the final steps) against LRA's 36.37.
  assert rows["lra_transformer"] in compared
  assert rows["lra_transformer"].endswith("| 36.37 (LRA) | 37.00 (final mean) | +0.63 |")
  # The others: listed apart, no published number, no gap, the reason on the row.
  for label in ("simple_tiny", "rehearsal", "simple_100_steps"):
    assert rows[label] in other and "37.45" not in rows[label], rows[label]
    assert not re.search(r"\| [+-]\d+\.\d\d \|$", rows[label]), rows[label]
  assert "the :tiny size" in rows["simple_tiny"] and "another size, length" in rows["simple_tiny"]
  assert "model.emb_dim 64 (published 512)" in rows["simple_tiny"]
  assert "a rehearsal (reproduce.py --rehearse" in rows["rehearsal"]
  assert ("another protocol than the published cell: num_train_steps 100 (published 15000)"
          in rows["simple_100_steps"])


def test_comparability_names_what_differs_from_the_closest_paper_config():
  paper = lra.make_config("listops", "simple")
  references = compare.paper_configs("listops", "simple")
  assert set(references) == {"paper size", ":authors"}   # simple is no LRA baseline
  assert reporting.comparability_problem(paper, references) is None
  assert reporting.comparability_problem(lra.make_config("listops", "simple", "authors"),
                                         references) is None   # the same size, their function
  assert reporting.comparability_problem(paper, {}) == "no paper-size config to compare with"
  longer = lra.make_config("listops", "simple", "tiny_lra")   # LRA's lengths, :tiny model
  longer.num_train_steps = paper.num_train_steps
  problem = reporting.comparability_problem(longer, references)
  assert problem.startswith("another size than the published cell: model.emb_dim ")
  assert "max_length" not in problem and "max_tokens" not in problem
  short = lra.make_config("listops", "simple")
  short.data.max_tokens = 200
  assert reporting.comparability_problem(short, references) == (
      "another length than the published cell: data.max_tokens 200 (published 2000)")
  assert compare.tiny_size("listops", "simple", lra.make_config("listops", "simple", "tiny"))
  assert not compare.tiny_size("listops", "simple", paper)


def test_software_lines_name_versions_devices_and_commit():
  record = software_record.software("cpu", 2, 1)
  for key in ("python_version", "jax_version", "jaxlib_version", "flax_version",
              "optax_version", "orbax_checkpoint_version", "numpy_version"):
    assert isinstance(record[key], str) and record[key], key
  assert record["jax_version"] == jax.__version__ and record["numpy_version"] == np.__version__
  assert (record["device_kind"], record["device_count"], record["process_count"]) == ("cpu", 2, 1)
  assert record["git_commit"] is None or re.fullmatch(r"[0-9a-f]{40}", record["git_commit"])
  line = software_record.software_line({**record, "git_commit": "0123456789abcdef",
                                        "git_dirty": True})
  assert line.startswith(f"python {record['python_version']}, jax {jax.__version__}, jaxlib ")
  assert line.endswith("; cpu x2, 1 process; git 0123456789 (dirty)")
  assert software_record.software_line({"test_accuracy": 0.5}) == "not recorded"
  group = reporting.RunGroup("g", "listops", "simple", {0: record, 1: record, 2: {}})
  text = reporting.software_markdown([group])
  assert f"- g: {software_record.software_line(record)} (2 runs); and not recorded (1 run)" in text


def test_published_table_names_registered_attentions_and_known_tasks():
  names = set(attention.names())
  for entry in published.PUBLISHED:
    assert entry.attention in names, entry
    assert entry.task in tasks.lra_tasks() and entry.source in published.PROTOCOLS
    assert entry.accuracy is None or 10 < entry.accuracy < 100
  assert {e.task for e in published.PUBLISHED if e.accuracy is None} == {"pathx"}


def test_compare_lists_the_reference_rows_of_the_tasks_it_shows():
  text = compare.references_markdown(["listops", "listops", "agnews"])
  s4 = next(r for r in published.REFERENCES if r.model == "S4")
  assert "- listops: " in text and f"S4 {s4.accuracies[0]:.2f}" in text
  assert text.count("- listops") == 1 and "agnews" not in text
  assert s4.source in text and s4.checked in text
  assert "Transformer + Rotary + masked SPT 61.49 (unchecked)" in text
  assert compare.references_markdown(["agnews"]) == ""
