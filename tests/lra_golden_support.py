"""Loading the LRA golden fixtures (``scripts/lra_golden.py``) into this project's models.

The fixtures hold LRA's own initialised weights, a padded batch and LRA's logits, made by
LRA's code (``tests/fixtures/lra/``). This module maps LRA's parameter names onto ours
through an explicit table, builds our model from the config file of the same attention and
task with the options of LRA's bugs (``configs.lra.apply_lra_model_bugs``, the model half of
the ``:lra_code`` variant), and runs it. Nothing here imports LRA or the old flax.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from configs import lra
from simpletron_jax.model import encoders

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "lra"
SCRIPT = pathlib.Path(__file__).parents[1] / "scripts" / "lra_golden.py"
# LRA's model_type -> our registry name.
ATTENTION = {"transformer": "softmax", "linear_transformer": "linear",
             "performer": "performer", "linformer": "linformer", "local": "local",
             "sparse_transformer": "sparse", "longformer": "longformer",
             "bigbird": "bigbird", "sinkhorn": "sinkhorn", "synthesizer": "synthesizer_random",
             "reformer": "reformer"}
# The fixture's task -> our task.
TASKS = {"listops": "listops", "text": "text", "image": "image", "pathfinder": "pathfinder",
         "retrieval": "retrieval"}

# LRA parameter names -> ours. Encoder-level names first; attention-internal names of a
# model_type in ATTENTION_NAMES (LRA's name under the attention module -> ours).
_ENCODER_NAMES = [
    (r"^Embed_0/", "embed/"),
    (r"^posembed_input/", "posembed/"),
    (r"^cls$", "cls"),
    (r"^(encoderblock_\d+)/LayerNorm_0/", r"\1/LayerNorm_0/"),
    (r"^(encoderblock_\d+)/LayerNorm_2/", r"\1/LayerNorm_1/"),
    (r"^(encoderblock_\d+)/MlpBlock_3/", r"\1/MlpBlock_0/"),
    (r"^(encoderblock_\d+)/[A-Za-z]+Attention_1/", r"\1/attention/"),
    (r"^encoder_norm/", "encoder_norm/"),
]
_HEAD_NAMES = {"mlp": "head_hidden", "mlp2": "head_hidden2", "logits": "head_logits"}
ATTENTION_NAMES: dict[str, dict[str, str]] = {
    "transformer": {},
    "linear_transformer": {},
    "performer": {},
    "linformer": {"lr_kernel": "proj_E"},
    "local": {},
    "sparse_transformer": {},
    "longformer": {"query_sliding_window": "query", "key_sliding_window": "key",
                   "value_sliding_window": "value"},
    "bigbird": {},
    "sinkhorn": {"DenseGeneral_0": "sort_net"},
    "synthesizer": {"random": "random_logits", "random1": "random_factor1",
                    "random2": "random_factor2"},
    "reformer": {},
}
# LRA's model keyword arguments (the fixture's kwargs) -> our attention_kwargs names, where
# they differ; an LRA kwarg with the same name as one of ours is passed as it is.
KWARG_NAMES: dict[str, dict[str, str]] = {
    "local": {},
    "longformer": {"sliding_window_size": "window"},
    "bigbird": {},
    "sinkhorn": {},
}


def manifest() -> dict:
  """``tests/fixtures/lra/manifest.json``."""
  with open(FIXTURES / "manifest.json") as f:
    return json.load(f)


def case_names(status: str = "ok") -> list[str]:
  """The fixture cases whose LRA run ended with ``status`` (``"ok"`` or ``"lra_error"``)."""
  return sorted(k for k, v in manifest()["cases"].items() if v["status"] == status)


def load(name: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict]:
  """(LRA's flat params ``{"a/b": array}``, the other arrays, the manifest entry)."""
  data = np.load(FIXTURES / f"{name}.npz")
  params = {k[len("param/"):]: data[k] for k in data.files if k.startswith("param/")}
  arrays = {k: data[k] for k in data.files if not k.startswith("param/")}
  return params, arrays, manifest()["cases"][name]


def _rename_encoder(path: str, model_type: str) -> str:
  for pattern, repl in _ENCODER_NAMES:
    new, n = re.subn(pattern, repl, path)
    if n:
      path = new
      break
  else:
    raise KeyError(f"no name rule for LRA parameter {path!r}")
  block = re.match(r"^(encoderblock_\d+/attention/)(.*)$", path)
  if block:
    inner = block.group(2)
    for lra_name, ours in ATTENTION_NAMES.get(model_type, {}).items():
      if inner == lra_name or inner.startswith(lra_name + "/"):
        inner = ours + inner[len(lra_name):]
        break
    path = block.group(1) + inner
  return "encoder/" + path


def lra_to_ours(flat: dict[str, np.ndarray], model_type: str) -> dict[str, np.ndarray]:
  """Renames LRA's flat parameters to ours (``encoder/...``, ``head_*``).

  Raises:
    KeyError: for an LRA name no rule covers.
  """
  out = {}
  for path, value in flat.items():
    top = path.split("/")[0]
    if top in _HEAD_NAMES:
      out[_HEAD_NAMES[top] + path[len(top):]] = value
    elif top == "encoder":       # the dual encoder's shared encoder
      out[_rename_encoder(path[len("encoder/"):], model_type)] = value
    else:
      out[_rename_encoder(path, model_type)] = value
  return out


def our_config(name: str, entry: dict):
  """Our config of the fixture's model: the config file's own (LRA's design choices), at
  the fixture's size and pooling, with the options of LRA's bugs that the ``:lra_code``
  variant sets (``configs.lra.apply_lra_model_bugs``).

  Raises:
    AssertionError: on ListOps, text or retrieval when the config file's pooling is not the
      pooling LRA's code ran (those configs must build LRA's model as it is).
  """
  model_type, task = name.split("__")[:2]
  kwargs = entry["kwargs"]
  config = lra.make_config(TASKS[task], ATTENTION[model_type])
  m = config.model
  for field in ("emb_dim", "num_heads", "qkv_dim", "mlp_dim", "num_layers"):
    m[field] = kwargs[field]
  m.max_length = kwargs.get("max_len", manifest()["length"])
  if task in ("listops", "text", "retrieval"):
    assert m.classifier_pool == kwargs["classifier_pool"], (
        f"configs/{task}/{ATTENTION[model_type]}.py pools by {m.classifier_pool}, LRA's "
        f"code by {kwargs['classifier_pool']}")
  m.classifier_pool = kwargs["classifier_pool"]   # image and pathfinder: the fixture's task
  if "learn_pos_emb" in kwargs:
    m.learn_pos_emb = kwargs["learn_pos_emb"]
  m.dropout_rate = m.attention_dropout_rate = 0.0
  lra.apply_lra_model_bugs(config)
  renames = KWARG_NAMES.get(model_type, {})
  for key, value in kwargs.items():   # LRA's per-model sizes (block_size, ...)
    key = renames.get(key, key)
    if key in m.attention_kwargs and key != "max_length":
      m.attention_kwargs[key] = value
  return config


def build(name: str, entry: dict, vocab_size: int, num_classes: int):
  """(our model, its config) for fixture ``name``."""
  config = our_config(name, entry)
  model = encoders.build_classifier(config.model, vocab_size=vocab_size,
                                    num_classes=num_classes, dual=name.endswith("__retrieval"))
  return model, config


def our_params(model, arrays: dict[str, np.ndarray], lra_flat: dict[str, np.ndarray],
               model_type: str) -> tuple[dict, list[str]]:
  """LRA's weights in our model's parameter tree, and the list of mismatches (names on one
  side only, or shapes that differ beyond LRA's ``[1, L, E]`` position table) - empty when
  the trees are the same."""
  args = [jnp.asarray(arrays["inputs"]), None]
  if "inputs2" in arrays:
    args += [jnp.asarray(arrays["inputs2"]), None]
  init = jax.eval_shape(model.init, jax.random.PRNGKey(0), *args)["params"]   # shapes only
  ours = {"/".join(k): v for k, v in traverse_util.flatten_dict(init).items()}
  mapped = lra_to_ours(lra_flat, model_type)
  problems = [f"only in LRA: {k}" for k in sorted(set(mapped) - set(ours))]
  problems += [f"only in ours: {k}" for k in sorted(set(ours) - set(mapped))]
  tree = {}
  for key in set(ours) & set(mapped):
    value = mapped[key]
    if value.shape != ours[key].shape:
      if key.endswith("pos_embedding") and value.size == ours[key].size:
        value = value.reshape(ours[key].shape)
      else:
        problems.append(f"{key}: LRA {value.shape}, ours {ours[key].shape}")
    tree[tuple(key.split("/"))] = jnp.asarray(value)
  return traverse_util.unflatten_dict(tree), problems


def logits(model, params, arrays) -> np.ndarray:
  """Our logits on the fixture's batch (deterministic), float32 ``[B, C]``."""
  args = [jnp.asarray(arrays["inputs"]), None]
  if "inputs2" in arrays:
    args += [jnp.asarray(arrays["inputs2"]), None]
  apply = jax.jit(lambda p, *a: model.apply({"params": p}, *a, deterministic=True),
                  static_argnums=tuple(i + 1 for i, x in enumerate(args) if x is None))
  return np.asarray(apply(params, *args))


def script():
  """``scripts/lra_golden.py`` as a module (it imports only numpy and the standard library at
  the top): its case names and :func:`seeded_params` / :func:`params_sha256`."""
  spec = importlib.util.spec_from_file_location("lra_golden_script", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_extra(name: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict]:
  """:func:`load` for a case of ``manifest()["extra_cases"]``."""
  data = np.load(FIXTURES / f"{name}.npz")
  params = {k[len("param/"):]: data[k] for k in data.files if k.startswith("param/")}
  arrays = {k: data[k] for k in data.files if not k.startswith("param/")}
  return params, arrays, manifest()["extra_cases"][name]


def paper_config(entry: dict):
  """Our ``configs/listops/transformer.py`` at its published size (no variant), with the
  options of LRA's bugs and dropout 0, for the paper-size case.

  Raises:
    AssertionError: when a size, the length or the pooling of our config is not the one
      LRA's ``listops/configs/transformer_base.py`` gave (``entry["kwargs"]``).
  """
  config = lra.make_config("listops", "softmax")
  m, kwargs = config.model, entry["kwargs"]
  ours = {f: m[f] for f in ("emb_dim", "num_heads", "qkv_dim", "mlp_dim", "num_layers")}
  ours.update(max_len=m.max_length, classifier_pool=m.classifier_pool)
  lras = {k: kwargs[k] for k in ours}
  assert ours == lras, f"configs/listops/transformer.py {ours}, LRA's config {lras}"
  m.dropout_rate = m.attention_dropout_rate = 0.0
  lra.apply_lra_model_bugs(config)
  return config


def paper_weights(entry: dict) -> dict[str, np.ndarray]:
  """The paper-size case's weights with LRA's names: ``seeded_params`` of the recorded
  names, shapes and seed (as ``scripts/lra_golden.py`` made them for LRA's model).

  Raises:
    AssertionError: when their SHA-256 is not the recorded one (not the weights LRA ran).
  """
  gen = script()
  flat = gen.seeded_params(entry["param_shapes"], entry["weights_seed"])
  digest = gen.params_sha256(flat)
  assert digest == entry["weights_sha256"], (
      f"seeded weights hash {digest}, LRA's run had {entry['weights_sha256']}")
  return flat


def max_differences() -> list[tuple[str, float]]:
  """``[(case, max |ours - LRA's| over the fixture's logits)]`` for every fixture LRA's code
  ran, in name order (float32 logits, so units of logits).

  Raises:
    AssertionError: when a case's parameter trees differ (the test's first check).
  """
  rows = []
  for name in case_names("ok"):
    lra_flat, arrays, entry = load(name)
    model, _ = build(name, entry, entry["kwargs"]["vocab_size"], entry["kwargs"]["num_classes"])
    params, problems = our_params(model, arrays, lra_flat, name.split("__")[0])
    assert not problems, (name, problems)
    rows.append((name, float(np.abs(logits(model, params, arrays) - arrays["logits"]).max())))
  return rows


def extra_differences() -> list[tuple[str, float]]:
  """:func:`max_differences` for the extra cases (``manifest()["extra_cases"]``): the
  Performer with unsaturated seeds, and the ListOps Transformer at the published size.

  Raises:
    AssertionError: when a case's parameter trees differ, or the paper case's sizes or
      weights are not LRA's (:func:`paper_config`, :func:`paper_weights`).
  """
  rows = []
  for name, entry in sorted(manifest()["extra_cases"].items()):
    lra_flat, arrays, entry = load_extra(name)
    kwargs = entry["kwargs"]
    if "weights_sha256" in entry:
      config = paper_config(entry)
      model = encoders.build_classifier(config.model, vocab_size=kwargs["vocab_size"],
                                        num_classes=kwargs["num_classes"])
      lra_flat = paper_weights(entry)
    else:
      model, _ = build(name, entry, kwargs["vocab_size"], kwargs["num_classes"])
    params, problems = our_params(model, arrays, lra_flat, name.split("__")[0])
    assert not problems, (name, problems)
    rows.append((name, float(np.abs(logits(model, params, arrays) - arrays["logits"]).max())))
  return rows


if __name__ == "__main__":
  # PYTHONPATH=. python tests/lra_golden_support.py \
  #     > benchmarks/results/cpu/lra_golden_differences.md
  diffs = max_differences()
  print("# Our logits against LRA's on the golden fixtures\n")
  print("`PYTHONPATH=. python tests/lra_golden_support.py` (CPU, float32); the test's limit is "
        "1e-4.\n")
  print("| case | max abs difference |\n|---|---|")
  for case, diff in diffs:
    print(f"| {case} | {diff:.2e} |")
  ordered = sorted(d for _, d in diffs)
  print(f"\n{len(diffs)} cases; largest {ordered[-1]:.2e}, median {ordered[len(ordered) // 2]:.2e}")
  print("\nBeside the grid: the Performer on ListOps with seeds below saturation (query kernels "
        "times 2^-20), and the ListOps Transformer at the published size (4 x 512, 2 x 2000 "
        "tokens, seeded weights).\n")
  print("| case | max abs difference |\n|---|---|")
  for case, diff in extra_differences():
    print(f"| {case} | {diff:.2e} |")
