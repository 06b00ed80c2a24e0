"""The analytic FLOP count of benchmarks/flops.py against hand counts."""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import flops  # noqa: E402
import speed_memory as sm  # noqa: E402
import step_time  # noqa: E402
from simpletron_jax.model import encoders  # noqa: E402
from simpletron_jax.train import run_config, steps, train_state  # noqa: E402


def test_einsum_scan_and_cond():
  a_2x3x4, b_2x4x5 = jnp.ones((2, 3, 4)), jnp.ones((2, 4, 5))
  batched = flops.function_flops(lambda a, b: jnp.einsum("bij,bjk->bik", a, b), a_2x3x4, b_2x4x5)
  assert batched.total == 2 * 2 * 3 * 4 * 5

  def scanned(w_4x4, xs_7x4):
    return jax.lax.scan(lambda c, x: (c @ w_4x4 + x, None), jnp.zeros(4), xs_7x4)[0]
  assert flops.function_flops(scanned, jnp.ones((4, 4)), jnp.ones((7, 4))).total == 7 * 2 * 16

  def branchy(p, x_3x4, w_4x6):
    return jax.lax.cond(p, lambda: (x_3x4 @ w_4x6).sum(), lambda: x_3x4.sum())
  assert flops.function_flops(branchy, True, jnp.ones((3, 4)), jnp.ones((4, 6))).total == 144


@pytest.mark.parametrize("name", ["softmax", "simple"])
def test_train_step_matches_a_hand_count(name):
  # One block, batch 4 over 2 devices (2 per device), length 16 + CLS, emb E, mlp M.
  b, t, e, h, m, c = 2, 17, 32, 4, 64, 2
  kwargs = {"implementation": "einsum"} if name == "softmax" else {}
  config = sm.lra_text_config(t - 1, name, kwargs, 4, "float32",
                              {"num_layers": 1, "emb_dim": e, "qkv_dim": e, "mlp_dim": m,
                               "num_heads": h})
  model = encoders.build_classifier(config.model, vocab_size=sm.BYTE_VOCAB, num_classes=c)
  state = jax.tree_util.tree_map(   # shapes suffice: no compile
      lambda x: jax.ShapeDtypeStruct((2, *x.shape), x.dtype),
      jax.eval_shape(lambda: train_state.create_train_state(
          run_config.TrainConfig.from_config_dict(config), model, jax.random.PRNGKey(0),
          config.model.max_length)))
  p_train, _ = steps.pmap_steps(model.apply)
  data = step_time.random_batch(np.random.default_rng(0), 4, t - 1, sm.BYTE_VOCAB, 2, c)
  count = flops.function_flops(p_train, state, data, jax.random.PRNGKey(0))
  projections = 3 * 2 * b * t * e * e                     # query, key, value
  mlp = 2 * (2 * b * t * e * m)                           # Dense(E->M), Dense(M->E)
  head = 2 * b * e * m + 2 * b * m * c                    # classifier on the CLS vector
  if name == "softmax":
    mixing = 2 * (2 * b * h * t * t * (e // h)) + 2 * b * t * e * e   # QK^T, PV, output proj.
  else:
    mixing = 2 * (2 * b * h * t * (e // h) ** 2)          # K^T V and Q (K^T V)
  forward = projections + mlp + head + mixing
  # Backward: two products of the same size per forward product (both operands need grads).
  assert count.total == count.dot_general == 3 * forward
  assert count.while_loops == 0


def test_step_time_config_spec_overrides_fields_and_names_a_bad_one():
  config = step_time.load_config(
      "configs/text/simple.py:tiny,model.length_multiple=8,model.attention_kwargs.normalizer=padded")
  assert config.model.length_multiple == 8
  assert config.model.attention_kwargs.normalizer == "padded"
  for bad in ("model.length_multipl=8", "model.length_multiple"):
    with pytest.raises(ValueError, match=f"'{bad}' is not FIELD=VALUE for a field of "
                                         "configs/text/simple.py"):
      step_time.load_config(f"configs/text/simple.py,{bad}")
