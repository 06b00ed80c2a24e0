"""LRA's Performer seed on ListOps: ``PRNGKey(ceil(sum(q) * 1e7))`` below saturation.

With ``lra_bugs`` our Performer draws each call's FAVOR+ projection from the sum of all the
batch's queries, as LRA's ``models/performer/performer_attention.py`` does
(``redraw_features=True``). With LRA's own initialisation that sum times 1e7 is beyond int32
and the conversion saturates, so the golden grid (``test_lra_golden.py``) cannot tell the
seed formula from a constant. Here:

- :func:`simpletron_jax.model.attention.performer.lra_query_seed_key` on sums whose seeds are known
  by hand (ceil, not floor, round or truncation; 1e7, not 1e6; saturation at both limits);
- the golden case ``performer__listops__unsaturated_seed`` from ``scripts/lra_golden.py``:
  LRA's code on its tiny ListOps Performer with every query kernel times 2^-20, so the
  seeds (9434 and -51330, recorded at LRA's ``random.PRNGKey`` call) vary with the queries.
  Our model draws from the same keys and gives LRA's logits within 1e-4, and each changed
  seed formula moves the logits by far more than that, so it would fail.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simpletron_jax.model.attention import performer
from tests import lra_golden_support as golden

CASE = "performer__listops__unsaturated_seed"
LOGIT_TOL = 1e-4
INT32 = np.iinfo(np.int32)


def _queries(value: float) -> jnp.ndarray:
  """[2, 3, 2, 4] float32 queries, zero but for ``value`` at two places (two examples, two
  heads), so their sum is ``2 * value`` exactly."""
  q = jnp.zeros((2, 3, 2, 4), jnp.float32)
  return q.at[0, 0, 0, 0].set(value).at[1, 2, 1, 3].set(value)


@pytest.mark.parametrize("value, seed", [
    # 2 * 2^-20 * 1e7 = 19.073486328125: ceil 20 (floor, round and truncation give 19;
    # 1e6 gives 2).
    (2.0 ** -20, 20),
    # -19.07...: ceil -19 (floor and round give -20).
    (-(2.0 ** -20), -19),
    # 2 * 3 * 2^-20 * 1e7 = 57.22...: ceil 58 (round 57).
    (3 * 2.0 ** -20, 58),
    # Beyond int32 the conversion saturates, as XLA's did in LRA's runs.
    (1e3, INT32.max),
    (-1e3, INT32.min),
])
def test_seed_is_the_ceiling_of_the_query_sum_times_1e7(value, seed):
  key = performer.lra_query_seed_key(_queries(value))
  np.testing.assert_array_equal(np.asarray(key), np.asarray(jax.random.PRNGKey(seed)))


def test_seed_keys_differ_below_saturation_and_agree_above():
  """Below the int32 limit each sum has its own key; above it, all share one."""
  keys = [tuple(np.asarray(performer.lra_query_seed_key(_queries(v)))) for v in
          (2.0 ** -20, 3 * 2.0 ** -20, -(2.0 ** -20))]
  assert len(set(keys)) == 3
  saturated = [tuple(np.asarray(performer.lra_query_seed_key(_queries(v))))
               for v in (1e3, 2e3)]
  assert saturated[0] == saturated[1]


def _case():
  lra_flat, arrays, entry = golden.load_extra(CASE)
  kwargs = entry["kwargs"]
  model, _ = golden.build(CASE, entry, kwargs["vocab_size"], kwargs["num_classes"])
  params, problems = golden.our_params(model, arrays, lra_flat, "performer")
  assert not problems, "parameter trees differ:\n" + "\n".join(problems)
  return model, params, arrays, entry


def test_lra_seeds_of_the_case_are_unsaturated():
  """The fixture is what it is for: LRA drew from one seed per layer, inside int32's range,
  different between layers, and agreeing with the manifest."""
  _, arrays, entry = golden.load_extra(CASE)
  seeds = arrays["query_seeds"]
  assert seeds.tolist() == entry["query_seeds"]
  assert len(seeds) == entry["kwargs"]["num_layers"] == 2
  assert len(set(seeds.tolist())) == len(seeds)
  assert np.all(np.abs(seeds) < 10 ** 6), seeds   # far from +-2^31


def test_our_model_draws_from_lra_seeds(monkeypatch):
  """Applied eagerly, the key of each of our layers' calls is ``PRNGKey`` of LRA's seed."""
  model, params, arrays, _ = _case()
  keys = []
  original = performer.lra_query_seed_key

  def recording(q):
    key = original(q)
    keys.append(np.asarray(key))   # concrete: the model runs eagerly here
    return key

  monkeypatch.setattr(performer, "lra_query_seed_key", recording)
  model.apply({"params": params}, jnp.asarray(arrays["inputs"]), None, deterministic=True)
  expected = [np.asarray(jax.random.PRNGKey(int(s))) for s in arrays["query_seeds"]]
  assert len(keys) == len(expected)
  for ours, lras in zip(keys, expected):
    np.testing.assert_array_equal(ours, lras)


def test_our_model_gives_lra_logits_with_unsaturated_seeds():
  model, params, arrays, _ = _case()
  ours = golden.logits(model, params, arrays)
  np.testing.assert_allclose(ours, arrays["logits"], atol=LOGIT_TOL, rtol=0)


def _seed_key(formula):
  """A stand-in for ``lra_query_seed_key`` with another seed ``formula(sum) -> int32``."""
  def key(q_BxLxHxK):
    total = jnp.sum(q_BxLxHxK.astype(jnp.float32))
    with jax.threefry_partitionable(False):
      return jax.random.PRNGKey(formula(total))
  return key


@pytest.mark.parametrize("formula", [
    lambda t: jnp.floor(t * 1e7).astype(jnp.int32),
    lambda t: jnp.round(t * 1e7).astype(jnp.int32),
    lambda t: jnp.ceil(t * 1e6).astype(jnp.int32),
    lambda t: jnp.int32(INT32.max),            # a saturated seed, whatever the queries
], ids=["floor", "round", "1e6", "saturated"])
def test_another_seed_formula_misses_lra_logits(monkeypatch, formula):
  """The case can fail: each changed formula is more than 100 tolerances from LRA's logits
  (measured: 0.6 to 1.4)."""
  model, params, arrays, _ = _case()
  monkeypatch.setattr(performer, "lra_query_seed_key", _seed_key(formula))
  ours = golden.logits(model, params, arrays)
  assert np.abs(ours - arrays["logits"]).max() > 100 * LOGIT_TOL


def test_the_ceil_stand_in_matches():
  """:func:`_seed_key` with LRA's own formula gives LRA's logits, so the misses above come
  from the formula and not from the stand-in."""
  model, params, arrays, _ = _case()
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(performer, "lra_query_seed_key",
               _seed_key(lambda t: jnp.ceil(t * 1e7).astype(jnp.int32)))
    ours = golden.logits(model, params, arrays)
  np.testing.assert_allclose(ours, arrays["logits"], atol=LOGIT_TOL, rtol=0)
