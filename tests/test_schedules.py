"""The LRA factor-string schedule against its formulas."""

import numpy as np
import pytest

from simpletron_jax.train.schedules import create_learning_rate_schedule


@pytest.mark.parametrize("warmup", [1000, 8000])
def test_rsqrt_schedule_matches_formula(warmup):
  base = 0.05
  schedule = create_learning_rate_schedule("constant * linear_warmup * rsqrt_decay", base, warmup)
  for step in (0, warmup // 2, warmup, 4 * warmup):
    expected = base * min(1.0, step / warmup) / np.sqrt(max(step, warmup))
    np.testing.assert_allclose(float(schedule(step)), expected, rtol=1e-6)
  np.testing.assert_allclose(float(schedule(4 * warmup)), float(schedule(warmup)) / 2, rtol=1e-6)


def test_lra_peak_value():
  schedule = create_learning_rate_schedule("constant * linear_warmup * rsqrt_decay", 0.05, 8000)
  np.testing.assert_allclose(float(schedule(8000)), 5.59e-4, rtol=1e-3)


def test_cosine_schedule():
  schedule = create_learning_rate_schedule("constant * linear_warmup * cosine_decay", 1e-3, 100,
                                           steps_per_cycle=1000)
  np.testing.assert_allclose(float(schedule(50)), 0.5e-3, rtol=1e-6)
  np.testing.assert_allclose(float(schedule(100)), 1e-3, rtol=1e-6)
  np.testing.assert_allclose(float(schedule(600)), 0.5e-3, rtol=1e-5)


def test_unknown_factor_names_the_field():
  with pytest.raises(ValueError, match="unknown learning-rate factor.*'rsqrt_dekay'.*factors="):
    create_learning_rate_schedule("constant * rsqrt_dekay")
