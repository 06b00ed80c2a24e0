"""Hugging Face BERT checkpoints into this project's encoder (SimpleTRON section 5.3).

SimpleTRON's blocks have BERT's weights, so a pretrained BERT loads into the encoder configured
as BERT (``docs/bert.md``) whatever its attention: softmax computes BERT (``tests/test_bert.py``
checks it against ``transformers`` to 1e-5), the Simple variants compute SimpleTRON.

A checkpoint is a local folder as Hugging Face writes it (nothing is downloaded):
``config.json``; ``model.safetensors`` (read with ``safetensors``) or ``pytorch_model.bin``
(``torch.load(weights_only=True)``, needs torch); ``vocab.txt`` for the tokenizer
(:mod:`simpletron_jax.data.agnews`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
from typing import Any, Mapping, Sequence

import numpy as np
from flax import traverse_util

from simpletron_jax.model import encoders, transfer
from simpletron_jax.runtime import atomic_io, cli
from simpletron_jax.train import saved_runs

CONFIG_FILE = "config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
VOCAB_FILE = "vocab.txt"
# Hugging Face ``hidden_act`` -> ``model.mlp_activation``: BERT's "gelu" is the exact erf form.
ACTIVATIONS = {"gelu": "gelu_exact", "gelu_python": "gelu_exact", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh"}


def _block_layout(i: int) -> list[tuple[str, str, str]]:
  hf, ours = f"encoder.layer.{i}.", f"encoder/encoderblock_{i}/"
  return [(ours + f"attention/{name}", hf + f"attention.self.{name}", "heads_in")
          for name in ("query", "key", "value")] + [
      (ours + "attention/out", hf + "attention.output.dense", "heads_out"),
      (ours + "LayerNorm_0", hf + "attention.output.LayerNorm", "norm"),
      (ours + "MlpBlock_0/Dense_0", hf + "intermediate.dense", "dense"),
      (ours + "MlpBlock_0/Dense_1", hf + "output.dense", "dense"),
      (ours + "LayerNorm_1", hf + "output.LayerNorm", "norm")]


def layout(num_layers: int) -> list[tuple[str, str, str]]:
  """``(our path, Hugging Face module, kind)`` of every BERT weight for ``num_layers`` blocks,
  the embeddings first and the pooler last.

  Our paths are :class:`~simpletron_jax.model.encoders.ClassificationEncoder`'s with
  ``embedding_type="bert"``, ``block_norm="post"``; Hugging Face's are ``BertModel``'s
  (``transformers/models/bert/modeling_bert.py``). Kinds: ``copy`` (an embedding table),
  ``dense`` (``weight [out, in]`` -> ``kernel [in, out]``, ``bias``), ``heads_in`` (q/k/v:
  ``kernel [E, H, K]``, ``bias [H, K]``), ``heads_out`` (attention output: ``kernel [H, K, E]``),
  ``norm`` (``weight`` -> ``scale``, ``bias``).
  """
  rows = [("encoder/embed/embedding", "embeddings.word_embeddings", "copy"),
          ("encoder/posembed/pos_embedding", "embeddings.position_embeddings", "copy"),
          ("encoder/token_type_embedding", "embeddings.token_type_embeddings", "copy"),
          ("encoder/embed_norm", "embeddings.LayerNorm", "norm")]
  for i in range(num_layers):
    rows += _block_layout(i)
  return rows + [("encoder/pooler", "pooler.dense", "dense")]


@dataclasses.dataclass(frozen=True)
class BertCheckpoint:
  """A Hugging Face BERT checkpoint read from disk: its folder ``path``, ``config.json`` as a
  dict, the ``weight_file`` and its ``tensors`` by Hugging Face name, floats as float32 numpy,
  without a ``bert.`` prefix (``BertForPreTraining``, ``BertForMaskedLM``) and with LayerNorm's
  old ``gamma``/``beta`` read as ``weight``/``bias``, as ``transformers`` loads them."""

  path: str
  config: dict[str, Any]
  tensors: dict[str, np.ndarray]
  weight_file: str

  @property
  def num_layers(self) -> int:
    """``num_hidden_layers`` of the config."""
    return int(self.config["num_hidden_layers"])

  @property
  def num_heads(self) -> int:
    """``num_attention_heads`` of the config."""
    return int(self.config["num_attention_heads"])


def _normalise_name(name: str) -> str:
  if name.startswith("bert."):
    name = name[len("bert."):]
  if name.endswith(".gamma"):
    return name[:-len(".gamma")] + ".weight"
  if name.endswith(".beta"):
    return name[:-len(".beta")] + ".bias"
  return name


def _read_weights(path: str) -> dict[str, np.ndarray]:
  """The tensors of a ``.safetensors`` or torch ``.bin`` file as numpy, floats as float32.

  Raises:
    ImportError: naming the package to install (``safetensors``, or ``torch`` for a ``.bin``).
    ValueError: naming ``path`` when the file cannot be read.
  """
  if path.endswith(".safetensors"):
    try:
      from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel
    except ImportError:
      raise ImportError(f"{path}: reading .safetensors needs the safetensors package "
                        "(pip install safetensors)") from None
    try:
      raw = load_file(path)
    except Exception as e:  # pylint: disable=broad-except  (a damaged or bfloat16 file)
      raise ValueError(f"{path}: cannot read the safetensors file ({type(e).__name__}: {e})"
                       ) from None
    return {k: np.asarray(v, dtype=np.float32) if np.issubdtype(v.dtype, np.floating)
            else np.asarray(v) for k, v in raw.items()}
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ImportError(f"{path}: reading pytorch_model.bin needs torch (pip install "
                      "'simpletron-jax[torch]'), or give the folder a model.safetensors"
                      ) from None
  try:
    state = torch.load(path, map_location="cpu", weights_only=True)
  except Exception as e:  # pylint: disable=broad-except  (a damaged or non-torch file)
    raise ValueError(f"{path}: cannot read the torch checkpoint ({type(e).__name__}: {e})"
                     ) from None
  return {k: (v.float() if v.is_floating_point() else v).numpy() for k, v in state.items()}


def read_checkpoint(directory: str) -> BertCheckpoint:
  """Reads a Hugging Face BERT folder (``~`` expanded), preferring ``model.safetensors``.

  Raises:
    FileNotFoundError: naming the folder and the files it lacks.
    ValueError: an unreadable file, or a config :func:`check_bert_config` refuses.
    ImportError: see :func:`_read_weights`.
  """
  folder = os.path.expanduser(directory)
  config_path = os.path.join(folder, CONFIG_FILE)
  weights = [os.path.join(folder, f) for f in WEIGHT_FILES
             if os.path.isfile(os.path.join(folder, f))]
  if not os.path.isfile(config_path) or not weights:
    raise FileNotFoundError(
        f"{directory!r} is not a Hugging Face BERT checkpoint folder: it needs {CONFIG_FILE} "
        f"and one of {' or '.join(WEIGHT_FILES)} (e.g. the files of bert-base-cased, "
        "downloaded beforehand; see docs/bert.md)")
  try:
    with open(config_path) as f:
      config = json.load(f)
  except ValueError as e:
    raise ValueError(f"{config_path}: not valid JSON ({e})") from None
  check_bert_config(config, config_path)
  tensors = {_normalise_name(k): v for k, v in _read_weights(weights[0]).items()}
  return BertCheckpoint(path=folder, config=config, tensors=tensors, weight_file=weights[0])


def check_bert_config(config: Mapping[str, Any], where: str = CONFIG_FILE) -> None:
  """Refuses a ``config.json`` (``config``, parsed; ``where``, its file) this module cannot load.

  Raises:
    ValueError: naming ``where`` and the key: a missing size, ``model_type`` not ``"bert"``,
      ``position_embedding_type`` not ``"absolute"``, ``hidden_size`` not divisible by
      ``num_attention_heads``, or a ``hidden_act`` outside :data:`ACTIVATIONS`.
  """
  for key in ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
              "vocab_size"):
    if not isinstance(config.get(key), int) or config[key] <= 0:
      raise ValueError(f"{where}: {key} must be a positive int, found {config.get(key)!r}")
  if config.get("model_type", "bert") != "bert":
    raise ValueError(f"{where}: model_type={config['model_type']!r}; only 'bert' loads here "
                     "(other families place positions and norms differently)")
  if config.get("position_embedding_type", "absolute") != "absolute":
    raise ValueError(f"{where}: position_embedding_type="
                     f"{config['position_embedding_type']!r}; only 'absolute' loads here")
  if config["hidden_size"] % config["num_attention_heads"]:
    raise ValueError(f"{where}: hidden_size={config['hidden_size']} is not divisible by "
                     f"num_attention_heads={config['num_attention_heads']}")
  if config.get("hidden_act", "gelu") not in ACTIVATIONS:
    raise ValueError(f"{where}: hidden_act={config['hidden_act']!r}; known: "
                     f"{sorted(ACTIVATIONS)}")


def model_fields(config: Mapping[str, Any]) -> dict[str, Any]:
  """The ``config.model`` fields that make this project's encoder the BERT of ``config`` (a
  ``config.json`` dict); the defaults of a missing key are Hugging Face's ``BertConfig``'s."""
  width = int(config["hidden_size"])
  return {"emb_dim": width, "qkv_dim": width, "num_heads": int(config["num_attention_heads"]),
          "mlp_dim": int(config["intermediate_size"]),
          "num_layers": int(config["num_hidden_layers"]),
          "max_positions": int(config.get("max_position_embeddings", 512)),
          "type_vocab_size": int(config.get("type_vocab_size", 2)),
          "layer_norm_epsilon": float(config.get("layer_norm_eps", 1e-12)),
          "mlp_activation": ACTIVATIONS[config.get("hidden_act", "gelu")],
          "embedding_type": "bert", "block_norm": "post", "pooler": True,
          "attention_bias": True, "learn_pos_emb": True, "final_layer_norm": False,
          "classifier_pool": "CLS"}


def check_model_config(config: Mapping[str, Any],
                       model: encoders.ModelConfig | Mapping[str, Any]) -> list[str]:
  """Where ``model`` (a ``ModelConfig``, or ``config.model`` read with its defaults) differs
  from the BERT of ``config`` (a ``config.json`` dict).

  Other sizes make :func:`import_bert` fail or leave weights out; other fields load but do not
  compute BERT. A ``num_layers`` below BERT's (its first blocks, as the SimpleTRON authors'
  6-block model) is no difference.

  Returns:
    One ``model.<field>: config <value>, checkpoint <value>`` line per difference, sorted.
  """
  if not isinstance(model, encoders.ModelConfig):
    model = encoders.ModelConfig.from_config_dict(model)
  out = []
  for field, want in sorted(model_fields(config).items()):
    have = getattr(model, field)
    if field == "num_layers" and have is not None and have <= want:
      continue
    if field == "layer_norm_epsilon" and have is not None and np.isclose(have, want,
                                                                         rtol=1e-6, atol=0):
      continue
    if have != want:
      out.append(f"model.{field}: config {have!r}, checkpoint {want!r}")
  return out


def _convert_one(kind: str, prefix: str, tensors: Mapping[str, np.ndarray], heads: int
                 ) -> dict[str, np.ndarray]:
  """Our leaves (``{"kernel": ..., "bias": ...}`` etc.) of one Hugging Face module."""
  if kind == "copy":
    return {"": tensors[prefix + ".weight"]}
  out = {}
  weight, bias = tensors.get(prefix + ".weight"), tensors.get(prefix + ".bias")
  if kind == "norm":
    out["scale"] = weight
  elif kind == "dense":
    out["kernel"] = weight.T
  elif kind == "heads_in":   # [E_out, E_in] -> [E_in, H, K]
    e_out, e_in = weight.shape
    out["kernel"] = weight.T.reshape(e_in, heads, e_out // heads)
    if bias is not None:
      bias = bias.reshape(heads, e_out // heads)
  elif kind == "heads_out":   # [E_out, H*K] -> [H, K, E_out]
    e_out, width = weight.shape
    out["kernel"] = weight.T.reshape(heads, width // heads, e_out)
  if bias is not None:
    out["bias"] = bias
  return out


def convert(checkpoint: BertCheckpoint) -> tuple[dict[str, Any], list[str]]:
  """BERT's weights at this project's paths (:func:`layout`).

  Returns:
    ``(params, unused)``: a nested float32 numpy tree ``{"encoder": {...}}`` with every block of
    the checkpoint, leaving out modules it lacks (e.g. a ``BertForMaskedLM``'s pooler); the
    sorted Hugging Face names with no place in the encoder (``cls.*``, ``position_ids``).
  """
  tensors, heads = checkpoint.tensors, checkpoint.num_heads
  flat, used = {}, set()
  for ours, hf, kind in layout(checkpoint.num_layers):
    if hf + ".weight" not in tensors:
      continue
    used.update(n for n in (hf + ".weight", hf + ".bias") if n in tensors)
    for leaf, value in _convert_one(kind, hf, tensors, heads).items():
      flat[f"{ours}/{leaf}" if leaf else ours] = np.ascontiguousarray(value, np.float32)
  unused = sorted(set(tensors) - used)
  return traverse_util.unflatten_dict(flat, sep="/"), unused


def import_bert(checkpoint: BertCheckpoint | str, params, include: Sequence[str] = ()
                ) -> tuple[Any, transfer.SurgeryReport]:
  """Copies a BERT checkpoint (a :class:`BertCheckpoint` or its folder) into ``params``, by path.

  Args:
    params: freshly initialised parameters of a
      :class:`~simpletron_jax.model.encoders.ClassificationEncoder` with BERT's sizes
      (:func:`model_fields`); any attention.
    include: regexes of our paths to copy (empty: all), as ``config.init_include``.

  Returns:
    ``(params, report)``: ``params`` keeps its structure and dtypes; ``report`` is a
    :class:`simpletron_jax.model.transfer.SurgeryReport` whose ``dropped`` adds ``hf:<name>``
    for each checkpoint tensor with no path here.

  Raises:
    FileNotFoundError, ImportError, ValueError: as :func:`read_checkpoint`.
    ValueError: naming each path whose shape differs (:func:`transfer.transfer_params`).
  """
  if not isinstance(checkpoint, BertCheckpoint):
    checkpoint = read_checkpoint(checkpoint)
  source, unused = convert(checkpoint)
  out, report = transfer.transfer_params(source, params, include)
  report = transfer.SurgeryReport(copied=report.copied, new=report.new,
                                  dropped=report.dropped + [f"hf:{n}" for n in unused])
  return out, report


def save_as_run(checkpoint: BertCheckpoint, out_dir: str) -> str:
  """Writes BERT's converted weights as a ``train.py`` run's best checkpoint.

  ``out_dir/checkpoints/0`` holds ``{"params": ...}`` and their CRC-32
  (:func:`simpletron_jax.train.saved_runs.save_params`), which
  ``train.py --config.init_from=out_dir`` starts from; ``out_dir/bert_import.json`` records the
  source folder, weight file, ``config.json`` and unused tensors. Returns ``out_dir``.

  Raises:
    FileExistsError: naming ``out_dir/checkpoints`` when it exists.
  """
  folder = os.path.abspath(os.path.join(out_dir, "checkpoints"))
  if os.path.exists(folder):
    raise FileExistsError(f"{folder} exists; choose another output folder or delete it")
  os.makedirs(out_dir, exist_ok=True)
  params, unused = convert(checkpoint)
  saved_runs.save_params(out_dir, params, {"source": "bert_import", "bert_dir": checkpoint.path})
  atomic_io.write_json_atomic(os.path.join(out_dir, "bert_import.json"), {
      "source": checkpoint.path, "weight_file": checkpoint.weight_file,
      "config": checkpoint.config, "unused": unused})
  return out_dir


def _load_config(spec: str):
  """``path/to/config.py[:variant]`` -> the config's ``get_config(variant)``."""
  path, _, variant = spec.partition(":")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"--config {path}: no such config file")
  module_spec = importlib.util.spec_from_file_location("bert_import_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(variant or None)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  """``python -m simpletron_jax.tools.bert_import BERT_DIR OUT_DIR [--config CFG]``.

  Converts ``BERT_DIR`` into ``OUT_DIR`` (:func:`save_as_run`); with ``--config``, also copies
  BERT into that config's model and prints the report and where the model is not BERT.

  Returns:
    ``{"out_dir", "unused"}``, with ``--config`` also ``"report"`` and ``"differences"``.
  """
  parser = argparse.ArgumentParser(prog="python -m simpletron_jax.tools.bert_import",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("bert_dir", help="a Hugging Face BERT folder (config.json, "
                                       "model.safetensors or pytorch_model.bin)")
  parser.add_argument("out_dir", help="where to write the run-shaped checkpoint")
  parser.add_argument("--config", default="",
                      help="a config (path[:variant]) to check the weights against")
  parser.add_argument("--verbose", action="store_true", help="keep tracebacks")
  args = parser.parse_args(argv)
  with cli.user_errors_exit("bert_import", args.verbose):
    checkpoint = read_checkpoint(args.bert_dir)
    result: dict[str, Any] = {"out_dir": save_as_run(checkpoint, args.out_dir),
                              "unused": convert(checkpoint)[1]}
    print(f"wrote {args.out_dir}/checkpoints (train.py --config.init_from={args.out_dir}); "
          f"{len(result['unused'])} checkpoint tensors have no place in the encoder",
          file=sys.stderr)
    if args.config:
      result.update(_check_against(checkpoint, _load_config(args.config)))
  return result


def _check_against(checkpoint: BertCheckpoint, config) -> dict[str, Any]:
  """The copy into ``config``'s model: report and differences, printed to stderr."""
  import jax  # pylint: disable=import-outside-toplevel
  vocab = int(checkpoint.config["vocab_size"])
  model = encoders.build_classifier(config.model, vocab_size=vocab, num_classes=4)
  tokens = np.ones((1, min(int(config.model.max_length), 8)), np.int32)
  params = jax.jit(lambda r: model.init({"params": r}, tokens))(jax.random.PRNGKey(0))
  _, report = import_bert(checkpoint, params["params"])
  differences = check_model_config(checkpoint.config, config.model)
  print(f"into {config.model.attention}, {config.model.num_layers} blocks: "
        f"{report.summary()}; new: {', '.join(report.new)}", file=sys.stderr)
  for line in differences:
    print(f"not BERT's: {line}", file=sys.stderr)
  return {"report": report.to_dict(), "differences": differences}


if __name__ == "__main__":
  main()
