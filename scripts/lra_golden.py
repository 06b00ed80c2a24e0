"""Golden numbers from the ORIGINAL Long Range Arena code, for ``tests/test_lra_golden.py``.

Runs LRA's own model code (google-research/long-range-arena at ``cd31e5c``,
``flax.deprecated.nn``) in a separate environment and writes small fixtures: LRA's initialised
weights at a tiny size, a padded batch and LRA's logits on it, and for the Transformer on
ListOps the losses of 3 training steps of LRA's own ``listops/train.py::train_step``. The
fixtures are numbers only; LRA's code is never copied into this project, and the tests that
read the fixtures need neither LRA nor the old flax.

Recipe (CPU, about 4 minutes; see ``docs/lra_parity.md``)::

    python3 -m venv /tmp/lra-venv    # then jax 0.4.13 + flax 0.3.6: docs/lra_parity.md
    git clone https://github.com/google-research/long-range-arena /tmp/lra
    git -C /tmp/lra checkout cd31e5c
    /tmp/lra-venv/bin/python scripts/lra_golden.py --lra_src /tmp/lra \
        --out tests/fixtures/lra

Output: ``<out>/<model_type>__<task>.npz`` per case (arrays ``param/<path>`` with LRA's
parameter names, ``inputs`` [B, L] int32 (``inputs2`` for retrieval), ``logits`` [B, C]
float32, and for ``transformer__listops`` also ``train_inputs`` [3, B, L], ``train_targets``
[3, B], ``train_losses`` [3] and ``train_losses_warm`` [3]), and ``<out>/manifest.json``: for
each case LRA's model kwargs, the call, and either ``"ok"`` or the exception LRA's code
raised. Exit status 0 even when some LRA models raise: the manifest records it. The
manifest's ``lra_commit`` is the full SHA of the LRA source (``git rev-parse HEAD`` there, or
``--lra_commit`` for a copy that is not a git checkout); a run refuses to add cases to a
manifest made from another commit.

Two more cases, beside the model x task grid (``manifest["extra_cases"]``, see
:data:`EXTRA_CASES`):

- ``performer__listops__unsaturated_seed``: LRA's Performer on ListOps at the tiny size with
  each layer's query kernel times :data:`QUERY_SCALE`, so that ``sum(q) * 1e7`` is well
  inside int32 and the per-call feature seed ``ceil(sum(q) * 1e7)`` varies with the queries
  (with LRA's own initialisation it saturates at the int32 limit). The npz holds the scaled
  weights, the batch, LRA's logits and ``query_seeds`` [num_layers] int64, the seeds LRA's
  code drew its features from, recorded at its ``random.PRNGKey`` call.
- ``transformer__listops__paper``: LRA's Transformer at its ListOps config's size
  (``listops/configs/transformer_base.py``: 4 layers, emb 512, 8 heads, qkv 512, mlp 1024,
  max_len 2000) on one padded batch of 2. Its 8.9M weights are not stored: they are
  :func:`seeded_params` of LRA's parameter names and shapes (recorded in the manifest) and a
  seed, their SHA-256 (:func:`params_sha256`) is recorded, and the npz holds only the batch
  and LRA's logits. The tests rebuild the same weights, check the hash, and compare logits.

Tasks here are LRA's encoder as each task's ``train.py`` calls it, at a tiny size (emb 32,
2 heads, qkv 32, mlp 64, 2 layers, 3 or 4 examples of at most 150 tokens):
``listops`` (CLS, sinusoidal, vocab 20, 10 classes), ``text`` (CLS, vocab 257, 2 classes),
``image`` (CLS, learned positions, pixel values 0..255 whose zeros LRA treats as pads),
``pathfinder`` (MEAN, pixels), ``retrieval`` (LRA's ``<Model>DualEncoder``, called directly
because ``matching/train.py`` as released fails in ``get_model``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import types
import zlib

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODEL_TYPES = ("transformer", "linear_transformer", "performer", "linformer", "local",
               "sparse_transformer", "longformer", "bigbird", "sinkhorn", "synthesizer",
               "reformer")
TASKS = ("listops", "text", "image", "pathfinder", "retrieval")
SIZE = dict(emb_dim=32, num_heads=2, qkv_dim=32, mlp_dim=64, num_layers=2)
LENGTH = 150            # max_len, CLS excluded
# Longer inputs where LRA's code needs them: BigBird's dual encoder takes no block_size, so
# its block is 64, and it draws 3 random blocks only when there are enough blocks.
CASE_LENGTH = {"bigbird__retrieval": 600}
BATCH = 4
# Keyword arguments of LRA's model classes that LRA's configs or model defaults set per model
# type, at the tiny size: block sizes small enough that a 151-token input has several blocks.
MODEL_KWARGS = {
    "local": {"block_size": 16},
    "bigbird": {"block_size": 16},
    "sinkhorn": {"block_size": 15},   # Sinkhorn needs L % block_size == 0
    "longformer": {"sliding_window_size": 32},
}
# listops/configs/performer_base.py: FAVOR+ softmax features, 2 of them.
LISTOPS_KWARGS = {"performer": {"attention_fn_cls": "softmax",
                                "attention_fn_kwargs": {"ortho_scaling": 0.0, "nb_features": 2}}}
TASK_CALL = {   # vocab, classes, pooling, learned positions, pixel inputs
    "listops": (20, 10, "CLS", False, False),
    "text": (257, 2, "CLS", False, False),
    "image": (256, 10, "CLS", True, True),
    "pathfinder": (256, 2, "MEAN", False, True),
    "retrieval": (257, 2, "CLS", False, False),
}
# The extra cases (module docstring).
PERFORMER_SEED_CASE = "performer__listops__unsaturated_seed"
PAPER_CASE = "transformer__listops__paper"
EXTRA_CASES = (PERFORMER_SEED_CASE, PAPER_CASE)
# A power of two, so scaling LRA's initialised query kernels is exact in float32. With LRA's
# initialisation the tiny Performer's sum(q) is 989 and -5419 in its 2 layers (seeds saturated
# at +-2^31); times this scale the seeds are 9434 and -51330: far from int32's limits, and far
# enough from 0 that a seed formula off by a factor or a rounding gives another seed.
QUERY_SCALE = 2.0 ** -20
# The paper case: ListOps's vocabulary in this project (simpletron_jax.data.listops.VOCAB_SIZE;
# LRA's came from the encoder its input pipeline built) and the real lengths of its 2 rows.
PAPER_VOCAB = 16
PAPER_LENGTHS = (2000, 1231)
DUAL_CLASSES = {"transformer": ("transformer", "TransformerDualEncoder"),
                "linear_transformer": ("linear_transformer", "LinearTransformerDualEncoder"),
                "performer": ("performer", "PerformerDualEncoder"),
                "linformer": ("linformer", "LinformerDualEncoder"),
                "local": ("local", "LocalTransformerDualEncoder"),
                "sparse_transformer": ("sparse_transformer", "SparseTransformerDualEncoder"),
                "longformer": ("longformer", "LongformerDualEncoder"),
                "bigbird": ("bigbird", "BigBirdDualEncoder"),
                "sinkhorn": ("sinkhorn_transformer", "SinkhornTransformerDualEncoder"),
                "synthesizer": ("synthesizer", "SynthesizerDualEncoder"),
                "reformer": ("reformer", "ReformerDualEncoder")}


def _stub_tensorflow() -> None:
  """LRA's train.py files import TensorFlow for their input pipelines only; the parts used
  here (model construction, ``train_step``) never touch it, so empty modules stand in."""

  import importlib.abc
  import importlib.machinery

  class _Any(types.ModuleType):
    __path__: list = []

    def __getattr__(self, name):
      if name.startswith("__"):
        raise AttributeError(name)
      return _Any(f"{self.__name__}.{name}")

    def __call__(self, *args, **kwargs):
      return _Any(self.__name__)

  class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    ROOTS = ("tensorflow", "tensorflow_datasets", "tensorflow_text", "tensorboard")

    def find_spec(self, fullname, path=None, target=None):
      if fullname.split(".")[0] in self.ROOTS:
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
      return None

    def create_module(self, spec):
      return _Any(spec.name)

    def exec_module(self, module):
      pass

  sys.meta_path.insert(0, _Finder())


def _flatten(tree, prefix=""):
  """``{"a": {"b": x}}`` -> ``{"a/b": np.asarray(x)}``."""
  out = {}
  for key, value in tree.items():
    path = f"{prefix}/{key}" if prefix else str(key)
    if hasattr(value, "items"):
      out.update(_flatten(value, path))
    else:
      out[path] = np.asarray(value)
  return out


def _replace_leaves(tree, flat: dict, prefix=""):
  """``tree`` with each leaf replaced by ``flat[path]`` (``path`` as :func:`_flatten` names
  it); empty sub-dicts, which LRA's modules without parameters leave, are kept."""
  out = {}
  for key, value in tree.items():
    path = f"{prefix}/{key}" if prefix else str(key)
    out[key] = (_replace_leaves(value, flat, path) if hasattr(value, "items")
                else flat[path])
  return out


def seeded_params(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
  """Deterministic weights for a parameter tree given by its names and shapes.

  Each array is drawn from numpy's legacy ``RandomState([seed, crc32(name)])``, whose
  streams numpy keeps unchanged across versions (NEP 19), so the LRA environment (numpy
  1.24) and this project's (numpy 2) make the same bits; one stream per name, so the order
  of ``shapes`` does not matter. Scales like an initialisation, by the name's last part:
  ``kernel`` N(0, 1/fan_in) (fan_in the first axis; ``out/kernel`` ``[H, K, E]``: H*K),
  LayerNorm ``scale`` 1 + N(0, 0.01), ``bias`` N(0, 0.01), anything else (embeddings, CLS,
  position tables) N(0, 1).

  Args:
    shapes: ``{"a/b": shape}`` with LRA's flat parameter names (``_flatten``).
    seed: a non-negative int.

  Returns:
    ``{"a/b": float32 array}``.
  """
  out = {}
  for name, shape in shapes.items():
    shape = tuple(int(d) for d in shape)
    draw = np.random.RandomState([seed, zlib.crc32(name.encode())]).standard_normal(shape)
    leaf = name.rsplit("/", 1)[-1]
    if leaf == "kernel":
      fan_in = math.prod(shape[:-1]) if name.endswith("out/kernel") else shape[0]
      value = draw / math.sqrt(fan_in)
    elif leaf == "scale":
      value = 1.0 + 0.1 * draw
    elif leaf == "bias":
      value = 0.1 * draw
    else:
      value = draw
    out[name] = np.asarray(value, np.float32)
  return out


def params_sha256(flat: dict[str, np.ndarray]) -> str:
  """SHA-256 (hex) of a flat parameter dict: per name in sorted order, the name, the shape
  and the little-endian float32 bytes."""
  digest = hashlib.sha256()
  for name in sorted(flat):
    value = np.ascontiguousarray(flat[name], dtype="<f4")
    digest.update(f"{name}:{value.shape};".encode())
    digest.update(value.tobytes())
  return digest.hexdigest()


def make_batch(rng: np.random.Generator, task: str, vocab: int, length: int = LENGTH):
  """A padded batch: [B, L] int32, rows of full, 140, 97 and 55 tokens (ids >= 1), zeros after.
  Pixel tasks draw 0..255 in every position, about 1 in 8 zero (black, a pad to LRA)."""
  if TASK_CALL[task][4]:
    x = rng.integers(1, vocab, size=(BATCH, length))
    x[rng.random((BATCH, length)) < 0.125] = 0
    return x.astype(np.int32)
  x = rng.integers(1, vocab, size=(BATCH, length)).astype(np.int32)
  for row, n in enumerate((length, 140, 97, 55)):
    x[row, n:] = 0
  return x


def _model_kwargs(model_type: str, task: str) -> dict:
  vocab, classes, pool, learn_pos, _ = TASK_CALL[task]
  kwargs = dict(vocab_size=vocab, max_len=CASE_LENGTH.get(f"{model_type}__{task}", LENGTH),
                classifier=True, num_classes=classes,
                classifier_pool=pool, learn_pos_emb=learn_pos, **SIZE)
  if task == "listops":   # listops/train.py passes no pooling: each encoder's default ran
    del kwargs["classifier_pool"]
  kwargs.update(MODEL_KWARGS.get(model_type, {}))
  if task == "listops":
    kwargs.update(LISTOPS_KWARGS.get(model_type, {}))
  if task == "retrieval":   # the dual encoders take neither, so LRA's defaults ran
    for key in ("learn_pos_emb", *MODEL_KWARGS.get(model_type, {})):
      del kwargs[key]
  return kwargs


_LAST_MODULE: list = []   # the class create_model built last, for its defaults


def create_model(flax_module, model_kwargs, key, input_shape):
  """LRA's ``create_model`` (every task's train.py) with ``init`` on zeros of the input shape
  in place of ``init_by_shape``, whose shape-only tracing fails under jax 0.4.13. Both
  initialise the same parameters from ``key``."""
  import jax.numpy as jnp
  from flax.deprecated import nn
  _LAST_MODULE[:] = [flax_module]
  module = flax_module.partial(**model_kwargs)
  with nn.stochastic(key):
    _, params = module.init(key, jnp.zeros(input_shape, jnp.float32))
  return nn.Model(module, params)


def run_case(model_type: str, task: str, seed: int):
  """Initialises LRA's model as its train.py does and returns (params, arrays, kwargs)."""
  import jax
  from flax.deprecated import nn
  from lra_benchmarks.utils import train_utils

  kwargs = _model_kwargs(model_type, task)
  rng = np.random.default_rng(seed)
  vocab = kwargs["vocab_size"]
  inputs = make_batch(rng, task, vocab, kwargs["max_len"])
  key = jax.random.PRNGKey(seed)
  if task == "retrieval":
    import importlib
    package, cls_name = DUAL_CLASSES[model_type]
    mod = importlib.import_module(f"lra_benchmarks.models.{package}.{package}")
    if model_type == "sparse_transformer":
      from lra_benchmarks.models.sparse_transformer import sparse_attention
      kwargs["attention_patterns"] = [sparse_attention.Fixed1Pattern(block_size=50),
                                      sparse_attention.Fixed2Pattern(block_size=50, c=10)]
    inputs2 = make_batch(rng, task, vocab, kwargs["max_len"])[::-1].copy()
    module = getattr(mod, cls_name).partial(**{k: v for k, v in kwargs.items()
                                               if k != "classifier"})
    with nn.stochastic(key):
      _, params = module.init(key, jax.numpy.zeros(inputs.shape, jax.numpy.float32),
                              jax.numpy.zeros(inputs.shape, jax.numpy.float32))
      model = nn.Model(module, params)
    logits = model(inputs, inputs2, train=False)
    arrays = {"inputs": inputs, "inputs2": inputs2}
  else:
    model = train_utils.get_model(model_type, create_model, dict(kwargs), key,
                                  inputs.shape)
    params = model.params
    with nn.stochastic(jax.random.PRNGKey(seed + 1)):
      logits = model(inputs, train=False)
    arrays = {"inputs": inputs}
  arrays["logits"] = np.asarray(logits, np.float32)
  kwargs.pop("attention_patterns", None)
  if "classifier_pool" not in kwargs:   # record the default that ran
    kwargs["classifier_pool"] = _default_pool()
  return params, arrays, kwargs


def _default_pool() -> str:
  """The default ``classifier_pool`` of the encoder :func:`create_model` built last (ListOps
  passes none, so that default ran)."""
  import inspect
  return inspect.signature(_LAST_MODULE[0].apply).parameters["classifier_pool"].default


def run_performer_unsaturated(seed: int):
  """:data:`PERFORMER_SEED_CASE`: LRA's Performer on ListOps (tiny, as in :func:`run_case`)
  with its query kernels times :data:`QUERY_SCALE`; records the seed of each call's
  features where LRA's ``performer_attention`` passes it to ``random.PRNGKey``.

  Returns:
    (params, arrays, kwargs) as :func:`run_case`; ``arrays["query_seeds"]`` int64
    [num_layers], in call order.

  Raises:
    RuntimeError: if a seed is at an int32 limit (saturated) or the calls were not one per
      layer.
  """
  import jax
  from flax.deprecated import nn
  from lra_benchmarks.models.performer import performer_attention
  from lra_benchmarks.utils import train_utils

  kwargs = _model_kwargs("performer", "listops")
  inputs = make_batch(np.random.default_rng(seed), "listops", kwargs["vocab_size"])
  model = train_utils.get_model("performer", create_model, dict(kwargs),
                                jax.random.PRNGKey(seed), inputs.shape)
  flat = _flatten(model.params)
  for name in flat:
    if name.endswith("/query/kernel"):
      flat[name] = (flat[name] * np.float32(QUERY_SCALE)).astype(np.float32)
  model = nn.Model(model.module, _replace_leaves(model.params, flat))
  seeds = []
  jax_random = performer_attention.random

  class _RecordingRandom:
    """``jax.random`` for LRA's module, noting the traced seeds given to ``PRNGKey`` (the
    per-call ``query_seed``; the constructor's ``PRNGKey(0)`` gets a Python int)."""

    def __getattr__(self, name):
      return getattr(jax_random, name)

    @staticmethod
    def PRNGKey(value):  # pylint: disable=invalid-name
      if not isinstance(value, int):
        seeds.append(int(value))
      return jax_random.PRNGKey(value)

  performer_attention.random = _RecordingRandom()
  try:
    with nn.stochastic(jax.random.PRNGKey(seed + 1)):
      logits = model(inputs, train=False)
  finally:
    performer_attention.random = jax_random
  limits = (np.iinfo(np.int32).min, np.iinfo(np.int32).max)
  if len(seeds) != kwargs["num_layers"] or any(v in limits for v in seeds):
    raise RuntimeError(f"{PERFORMER_SEED_CASE}: seeds {seeds}, expected {kwargs['num_layers']} "
                       "unsaturated ones")
  kwargs.update(classifier_pool=_default_pool(), query_scale=QUERY_SCALE)
  arrays = {"inputs": inputs, "logits": np.asarray(logits, np.float32),
            "query_seeds": np.asarray(seeds, np.int64)}
  return flat, arrays, kwargs


def run_listops_paper(seed: int):
  """:data:`PAPER_CASE`: LRA's Transformer on ListOps at its config's size, with
  :func:`seeded_params` weights, on 2 rows of :data:`PAPER_LENGTHS` real tokens.

  The model kwargs are assembled as ``listops/train.py`` assembles them from
  ``listops/configs/transformer_base.py`` (``vocab_size`` :data:`PAPER_VOCAB`).

  Returns:
    (manifest entry without ``status``, arrays ``inputs`` int32 [2, max_len] and ``logits``
    float32 [2, 10]).
  """
  import jax
  from flax.deprecated import nn
  from lra_benchmarks.listops.configs import transformer_base
  from lra_benchmarks.utils import train_utils

  config = transformer_base.get_config()
  kwargs = config.model_kwargs.to_dict() if "model_kwargs" in config else {}
  kwargs.update(vocab_size=PAPER_VOCAB, emb_dim=config.emb_dim, num_heads=config.num_heads,
                num_layers=config.num_layers, qkv_dim=config.qkv_dim, mlp_dim=config.mlp_dim,
                max_len=config.max_length, classifier=True, num_classes=10)
  if "model" in config:
    kwargs.update(config.model)
  rng = np.random.default_rng(seed + 11)
  inputs = rng.integers(1, PAPER_VOCAB, size=(len(PAPER_LENGTHS), kwargs["max_len"]))
  inputs = inputs.astype(np.int32)
  for row, n in enumerate(PAPER_LENGTHS):
    inputs[row, n:] = 0
  model = train_utils.get_model("transformer", create_model, dict(kwargs),
                                jax.random.PRNGKey(seed), inputs.shape)
  shapes = {k: list(v.shape) for k, v in _flatten(model.params).items()}
  flat = seeded_params(shapes, seed)
  model = nn.Model(model.module, _replace_leaves(model.params, flat))
  with nn.stochastic(jax.random.PRNGKey(seed + 1)):
    logits = model(inputs, train=False)
  kwargs["classifier_pool"] = _default_pool()
  entry = {"kwargs": kwargs, "lra_config": "lra_benchmarks/listops/configs/transformer_base.py",
           "lengths": list(PAPER_LENGTHS), "weights": "seeded_params", "weights_seed": seed,
           "param_shapes": shapes, "param_count": int(sum(v.size for v in flat.values())),
           "weights_sha256": params_sha256(flat)}
  return entry, {"inputs": inputs, "logits": np.asarray(logits, np.float32)}


def train_losses(lra_src: str, seed: int, warmup: int | None):
  """3 steps of LRA's ``listops/train.py::train_step`` (pmapped on 1 device, as LRA runs it)
  on the tiny Transformer with dropout 0, LRA's Adam (``create_optimizer``) and LRA's
  schedule from ``listops/configs/transformer_base.py``; ``warmup`` overrides the config's
  1000 (a larger learning rate, a stronger check). Returns (inputs [3,B,L], targets [3,B],
  losses [3])."""
  import functools
  import jax
  from absl import flags
  from flax import jax_utils
  from lra_benchmarks.listops import train as listops_train
  from lra_benchmarks.utils import train_utils

  flags.FLAGS(["lra_golden",
               f"--config={lra_src}/lra_benchmarks/listops/configs/transformer_base.py"])
  config = flags.FLAGS.config
  kwargs = _model_kwargs("transformer", "listops")
  kwargs.update(dropout_rate=0.0, attention_dropout_rate=0.0)
  rng = np.random.default_rng(seed + 7)
  inputs = np.stack([make_batch(rng, "listops", kwargs["vocab_size"]) for _ in range(3)])
  targets = rng.integers(0, kwargs["num_classes"], size=(3, BATCH)).astype(np.int32)
  model = train_utils.get_model("transformer", create_model, dict(kwargs),
                                jax.random.PRNGKey(seed), inputs.shape[1:])
  optimizer = jax_utils.replicate(listops_train.create_optimizer(model, config.learning_rate))
  lr_fn = train_utils.create_learning_rate_scheduler(
      factors=config.factors, base_learning_rate=config.learning_rate,
      warmup_steps=warmup or config.warmup)
  step = jax.pmap(functools.partial(listops_train.train_step, learning_rate_fn=lr_fn),
                  axis_name="batch")
  dropout_rngs = jax.random.split(jax.random.PRNGKey(seed), 1)
  losses = []
  for i in range(3):
    batch = {"inputs": inputs[i][None], "targets": targets[i][None]}
    optimizer, metrics, dropout_rngs = step(optimizer, batch, dropout_rng=dropout_rngs)
    losses.append(float(metrics["loss"][0] / metrics["denominator"][0]))
  return inputs, targets, np.asarray(losses, np.float64), {
      "learning_rate": config.learning_rate, "factors": config.factors,
      "warmup": config.warmup, "weight_decay": config.weight_decay}


def lra_commit(lra_src: str, given: str | None) -> str:
  """The full commit SHA of the LRA source at ``lra_src``.

  From ``git rev-parse HEAD`` when ``lra_src`` is the root of a git work tree (a folder
  inside another repository is not taken for one), else ``given`` (``--lra_commit``).

  Raises:
    ValueError: when neither gives a 40-hex SHA, when ``given`` is not a prefix of the
      checkout's HEAD, or when the work tree has changes to tracked files.
  """
  def git(*argv):
    return subprocess.run(["git", "-C", lra_src, *argv], capture_output=True, text=True,
                          check=True).stdout.strip()
  head = None
  try:
    if os.path.realpath(git("rev-parse", "--show-toplevel")) == os.path.realpath(lra_src):
      head = git("rev-parse", "HEAD")
      if git("status", "--porcelain", "--untracked-files=no"):
        raise ValueError(f"{lra_src} has local changes; golden numbers need LRA's code as "
                         "committed")
  except (OSError, subprocess.CalledProcessError):
    head = None
  if head and given and not head.startswith(given.lower()):
    raise ValueError(f"--lra_commit {given} but {lra_src} is at {head}")
  commit = (head or given or "").lower()
  if len(commit) != 40 or any(c not in "0123456789abcdef" for c in commit):
    raise ValueError(f"{lra_src} is not a git checkout: pass --lra_commit with the full "
                     "40-hex SHA of the LRA commit it holds")
  return commit


def main(argv=None) -> int:
  """Writes the fixtures (module docstring); returns 0.

  Raises:
    SystemExit: a bad invocation, one line and status 1
      (:meth:`simpletron_jax.runtime.cli.ArgumentParser.error`): a missing or unknown flag, an
      ``--lra_src`` without ``lra_benchmarks/``, a commit that cannot be told, an unknown extra
      case, a manifest made from another LRA commit.
  """
  if ROOT not in sys.path:   # appended: nothing of the project may shadow LRA's modules
    sys.path.append(ROOT)
  # Here, not at the top: the module imports only numpy and the standard library (the tests
  # load it for its functions); cli needs absl and ml_collections, which LRA's venv has.
  from simpletron_jax.runtime import cli  # pylint: disable=import-outside-toplevel
  parser = cli.ArgumentParser(prog="lra_golden.py", description=__doc__.split("\n\n")[0])
  parser.add_argument("--lra_src", required=True, help="an LRA checkout (its root)")
  parser.add_argument("--out", default="tests/fixtures/lra")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--models", default=",".join(MODEL_TYPES))
  parser.add_argument("--tasks", default=",".join(TASKS))
  parser.add_argument("--extras", default=",".join(EXTRA_CASES),
                      help="extra cases to make (comma-separated, '' for none): "
                      + ", ".join(EXTRA_CASES))
  parser.add_argument("--lra_commit", default=None,
                      help="the LRA commit's full SHA, when --lra_src is not a git checkout")
  args = parser.parse_args(argv)
  lra_src = os.path.abspath(args.lra_src)
  if not os.path.isdir(os.path.join(lra_src, "lra_benchmarks")):
    parser.error(f"--lra_src {lra_src}: no lra_benchmarks/ folder there")
  try:
    commit = lra_commit(lra_src, args.lra_commit)
  except ValueError as e:
    parser.error(str(e))
  extras = [e for e in args.extras.split(",") if e]
  unknown = sorted(set(extras) - set(EXTRA_CASES))
  if unknown:
    parser.error(f"--extras: unknown {unknown}; known: {', '.join(EXTRA_CASES)}")
  sys.path.insert(0, lra_src)
  _stub_tensorflow()
  import jax
  import flax
  os.makedirs(args.out, exist_ok=True)
  manifest_path = os.path.join(args.out, "manifest.json")
  manifest = {"cases": {}}
  if os.path.exists(manifest_path):
    with open(manifest_path) as f:
      manifest = json.load(f)
  if manifest.get("lra_commit", commit) != commit:
    parser.error(f"{manifest_path} was made from LRA {manifest['lra_commit']}, this source is "
                 f"{commit}: write the new fixtures into another --out")
  manifest.update(lra_commit=commit, jax=jax.__version__, flax=flax.__version__,
                  seed=args.seed, size=SIZE, length=LENGTH, batch=BATCH,
                  command="python scripts/lra_golden.py --lra_src DIR --out " + args.out)
  for model_type in [m for m in args.models.split(",") if m]:
    for task in [t for t in args.tasks.split(",") if t]:
      name = f"{model_type}__{task}"
      try:
        params, arrays, kwargs = run_case(model_type, task, args.seed)
      except Exception as e:  # LRA's own code failing is a result, recorded in the manifest
        manifest["cases"][name] = {"status": "lra_error",
                                   "error": f"{type(e).__name__}: {e}"[:500]}
        print(f"{name}: LRA's code raised {type(e).__name__}: {str(e)[:200]}")
        continue
      flat = {f"param/{k}": v for k, v in _flatten(params).items()}
      if name == "transformer__listops":
        for warm, suffix in ((None, ""), (2, "_warm")):
          t_in, t_y, t_loss, schedule = train_losses(lra_src, args.seed, warm)
          arrays[f"train_losses{suffix}"] = t_loss
          kwargs[f"train_schedule{suffix}"] = {**schedule, "warmup": warm or schedule["warmup"]}
        arrays["train_inputs"], arrays["train_targets"] = t_in, t_y
      np.savez_compressed(os.path.join(args.out, f"{name}.npz"), **flat, **arrays)
      manifest["cases"][name] = {"status": "ok", "kwargs": kwargs}
      print(f"{name}: ok, {len(flat)} parameter arrays, logits[0] {arrays['logits'][0][:3]}")
  extra = manifest.setdefault("extra_cases", {})
  if PERFORMER_SEED_CASE in extras:
    params, arrays, kwargs = run_performer_unsaturated(args.seed)
    flat = {f"param/{k}": v for k, v in _flatten(params).items()}
    np.savez_compressed(os.path.join(args.out, f"{PERFORMER_SEED_CASE}.npz"), **flat, **arrays)
    extra[PERFORMER_SEED_CASE] = {"status": "ok", "kwargs": kwargs,
                                  "query_seeds": arrays["query_seeds"].tolist()}
    print(f"{PERFORMER_SEED_CASE}: ok, LRA's seeds {arrays['query_seeds'].tolist()}")
  if PAPER_CASE in extras:
    entry, arrays = run_listops_paper(args.seed)
    np.savez_compressed(os.path.join(args.out, f"{PAPER_CASE}.npz"), **arrays)
    extra[PAPER_CASE] = {"status": "ok", **entry}
    print(f"{PAPER_CASE}: ok, {entry['param_count']} seeded weights, logits {arrays['logits']}")
  with open(manifest_path, "w") as f:
    json.dump(manifest, f, indent=1, sort_keys=True, default=str)
  return 0


if __name__ == "__main__":
  sys.exit(main())
