"""LRA's factor-string learning-rate schedule (LRA ``utils/train_utils.py``,
``create_learning_rate_scheduler``), as an optax-compatible callable."""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp

KNOWN_FACTORS = ("constant", "linear_warmup", "rsqrt_decay", "rsqrt_normalized_decay",
                 "decay_every", "cosine_decay")


def create_learning_rate_schedule(
    factors: str = "constant * linear_warmup * rsqrt_decay",
    base_learning_rate: float = 0.5,
    warmup_steps: int = 1000,
    decay_factor: float = 0.5,
    steps_per_decay: int = 20000,
    steps_per_cycle: int = 100000,
) -> Callable[[jnp.ndarray], jnp.ndarray]:
  """``lr(step)`` (int step to float32 rate): the product of the factors ``factors`` names.

  Factors (``step`` counts optimizer updates, from 0):

  * ``constant``: ``base_learning_rate``.
  * ``linear_warmup``: ``min(1, step / warmup_steps)``.
  * ``rsqrt_decay``: ``1 / sqrt(max(step, warmup_steps))``.
  * ``rsqrt_normalized_decay``: ``sqrt(warmup_steps) / sqrt(max(step, warmup_steps))``.
  * ``decay_every``: ``decay_factor ** (step // steps_per_decay)``.
  * ``cosine_decay``: ``max(0, 0.5 (1 + cos(pi * (p mod 1))))`` with
    ``p = max(0, (step - warmup_steps) / steps_per_cycle)``.

  The LRA default peaks at ``base / sqrt(warmup)`` (0.05, warmup 8000: 5.6e-4).

  Raises:
    ValueError: an unknown factor name, or ``warmup_steps <= 0`` with a warmup factor.
  """
  names = [n.strip() for n in factors.split("*") if n.strip()]
  unknown = [n for n in names if n not in KNOWN_FACTORS]
  if unknown:
    raise ValueError(f"unknown learning-rate factor(s) {unknown} in config field "
                     f"factors={factors!r}; known: {KNOWN_FACTORS}")
  if warmup_steps <= 0 and {"linear_warmup", "rsqrt_decay", "rsqrt_normalized_decay"} & set(names):
    raise ValueError(f"config field warmup={warmup_steps} must be positive for {factors!r}")

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    lr = jnp.float32(1.0)
    for name in names:
      if name == "constant":
        lr = lr * base_learning_rate
      elif name == "linear_warmup":
        lr = lr * jnp.minimum(1.0, step / warmup_steps)
      elif name == "rsqrt_decay":
        lr = lr / jnp.sqrt(jnp.maximum(step, warmup_steps))
      elif name == "rsqrt_normalized_decay":
        lr = lr * jnp.sqrt(warmup_steps) / jnp.sqrt(jnp.maximum(step, warmup_steps))
      elif name == "decay_every":
        lr = lr * decay_factor ** (step // steps_per_decay)
      elif name == "cosine_decay":
        progress = jnp.maximum(0.0, (step - warmup_steps) / float(steps_per_cycle))
        lr = lr * jnp.maximum(0.0, 0.5 * (1.0 + jnp.cos(jnp.pi * (progress % 1.0))))
    return lr

  return schedule
