"""benchmarks/paper_budget.py's slot plan: its arithmetic, and what each cell's flags change."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import paper_budget  # noqa: E402  pylint: disable=wrong-import-position

reproduce = paper_budget.reproduce


@pytest.fixture(scope="module")
def plans():
  """The slot plans of the ListOps simple cells, with and without 5b's grouping."""
  cell = reproduce.get_cell
  return {
      "5b": paper_budget.slot_plan(cell("listops_simple"), "listops_simple_fast"),
      "5b_random": paper_budget.slot_plan(cell("listops_simple"), "listops_simple_fast",
                                          overrides=("--config.data.group_by_length=False",)),
      "4": paper_budget.slot_plan(cell("listops_simple_authors"), "listops_simple_cls_only"),
  }


def test_a_slot_is_its_start_two_calls_and_the_wait_between(plans):
  h200 = paper_budget.H200
  for name, p in plans.items():
    assert p.call1_s <= paper_budget.CALL_S[0] + 1e-6, name   # the first call is cut to 9 min
    assert p.call2_s > 0, name   # none of these finishes in one call
    assert p.slot_s == pytest.approx(h200["machine_start_s"] + p.call1_s
                                     + h200["between_calls_s"] + p.call2_s), name
    assert p.fits == (p.slot_s <= 14 * 60 and p.call2_s <= 5 * 60), name
    assert p.validations == 300 and p.steps_per_sec > 0, name


def test_grouped_widths_cost_what_their_tokens_cost(plans):
  fast, random_order = plans["5b"], plans["5b_random"]
  assert random_order.train_s == pytest.approx(15000 / 28.6)   # the measured full-width rate
  step_full, fixed = 1 / 28.6, paper_budget.FIXED_STEP_S
  mix = sum(share * paper_budget.padded(w, 8) for w, share in
            paper_budget.GROUPED_WIDTH_SHARE.items()) / paper_budget.padded(2000, 8)
  assert fast.train_s == pytest.approx(15000 * (fixed + (step_full - fixed) * mix))
  assert fast.validation_s == random_order.validation_s   # the same bucketed validation
  assert fast.slot_s < random_order.slot_s


def test_the_authors_cell_validates_at_full_width(plans):
  full = plans["4"]
  per_example = (1 / 23.4) / 32 * paper_budget.H200["eval_per_train_example"]
  assert full.validation_s == pytest.approx(2000 * per_example
                                            + paper_budget.H200["validation_host_s"])
  assert full.compile_s == pytest.approx(paper_budget.H200["train_compile_s"]["simple"]
                                         + paper_budget.H200["eval_compile_s"])


def test_a_bucketed_cell_without_its_width_mix_is_refused():
  with pytest.raises(ValueError, match="--listops_data"):
    paper_budget.slot_plan(reproduce.get_cell("listops_simple"), "listops_simple_fast",
                           overrides=("--config.data.bucket=256",))
