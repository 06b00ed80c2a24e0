"""What a trained model looks at: token-to-token maps per layer and head, and token relevance.

For one example (a batch of one) this module computes, with no plotting
(``scripts/explain.py`` draws them):

* **maps**: per encoder block, per document (retrieval reads two) and per head, the
  ``[N, L]`` map ``A`` with which the head's output before the output projection is
  ``y_i = sum_j A_ij v_j``, ``v`` the value projection's output. Rows are the block's query
  positions, columns its key positions, both counting the CLS token (position 0 under CLS
  pooling) and any padding. Three methods, named in every result (:data:`METHODS`):

  - ``softmax_weights`` (``softmax``): the softmax weights, sown by the module
    (``softmax.softmax_weights``).
  - ``implicit_exact`` (``simple``, ``simple_res``, ``simple_resl``, ``linear``,
    ``performer``): the map the module never forms, ``q_i . k_j / sqrt(L)`` for Simple
    (Yorsh et al.) and ``phi(q_i) . phi(k_j) / (phi(q_i) . sum_j phi(k_j))`` for the kernel
    attentions (Katharopoulos et al., 2020; Choromanski et al., 2021), sown by the module on
    request (``simple.simple_map``, ``linear.feature_attention_map``).
  - ``value_jacobian`` (every other variant): ``A_ij = mean_c d y_i^c / d v_j^c``, the
    Jacobian of the head's output with respect to the values at position ``j``, with the
    queries and keys held at their values, averaged over the head's ``c`` channels
    (forward-mode, one JVP per position). Each of these variants is linear in its values;
    where the weight is one number per query, key and head (the softmax of ``local``,
    ``sparse``, ``longformer``, ``bigbird``, ``sinkhorn``, ``synthesizer*``, ``reformer``,
    ``linformer``) this is exactly that weight scattered onto the ``L x L`` grid; AFT
    weighs every channel separately (and gates it by ``sigmoid(q)``), and gets the mean of
    its per-channel weights.

  The sown maps cost nothing when not asked for: :func:`attention.base.sow_map` runs only
  under ``mutable=[base.MAPS]``, which the train and eval steps never request.

* **relevance**: per input token, gradient times input (Shrikumar et al., 2016,
  "Not Just a Black Box", arXiv:1605.01713; analysed by Ancona et al., ICLR 2018) of the
  explained class's logit with respect to the token embedding:
  ``R_j = sum_e x_je * d logit / d x_je``, ``x_j`` the embedding of token ``j`` (before the
  position is added). The same method for every variant; signed (positive: the token pushes
  towards the class).

No model code changes for this: the per-position gradients and the value tangents enter
through ``flax.linen.intercept_methods`` (on the ``embed`` and ``value`` submodules), and the
per-head outputs are read there (the ``out`` projection's input, or the attention's output
for the variants without one).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import traverse_util

from simpletron_jax.experiments import attentions
from simpletron_jax.model import encoders, layers
from simpletron_jax.model.attention import base

# The map methods (``attentions.EXPLAIN_METHODS``; each variant's is its
# ``AttentionRecipe.explain_method``) and what each computes.
METHODS = {
    "softmax_weights": "the softmax weights (sown by the module)",
    "implicit_exact": ("the exact implicit map A with y = A V, never formed in training "
                       "(sown by the module on request)"),
    "value_jacobian": ("the value Jacobian: A_ij = mean over the head's channels of "
                       "d y_i / d v_j with queries and keys held (exact for a variant whose "
                       "weights are one number per query, key and head)"),
}
RELEVANCE_METHOD = "gradient x input"
RELEVANCE_CITATION = ("Shrikumar et al., 'Not Just a Black Box: Learning Important Features "
                      "Through Propagating Activation Differences', arXiv:1605.01713 (2016); "
                      "Ancona et al., 'Towards better understanding of gradient-based "
                      "attribution methods for Deep Neural Networks', ICLR 2018")
# Submodules of an attention whose outputs are its values (Longformer has a second set for
# its global row).
VALUE_NAMES = ("value", "value_global")
_BLOCK_RE = re.compile(r"^encoderblock_(\d+)$")
_JVP_CHUNK = 64   # value tangents pushed through at once


def method_of(attention_name: str) -> str:
  """The map method of a registered variant (its ``AttentionRecipe.explain_method``): a key of
  :data:`METHODS`.

  Raises:
    ValueError: for an unknown name (naming ``model.attention``).
  """
  return attentions.get(attention_name).explain_method


def model_args(batch: Mapping[str, np.ndarray]) -> tuple:
  """The positional arguments of the classifier for ``batch``: ``(inputs, mask)`` or, for
  the dual encoder, ``(inputs, mask, inputs2, mask2)`` (the batch dict of
  ``data.common.make_batch``)."""
  args = (jnp.asarray(batch["inputs"]), jnp.asarray(batch["mask"]))
  if "inputs2" in batch:
    args += (jnp.asarray(batch["inputs2"]), jnp.asarray(batch["mask2"]))
  return args


def _block_of(module: nn.Module) -> int | None:
  """The block index of an ``EncoderBlock``'s ``attention`` submodule, else None."""
  parent = module.parent
  if module.name != "attention" or not isinstance(parent, layers.EncoderBlock):
    return None
  match = _BLOCK_RE.match(parent.name or "")
  return int(match.group(1)) if match else None


class _Probe:
  """A ``flax.linen.intercept_methods`` interceptor for one forward pass.

  It records, per attention call ``(block, call)`` (``call`` counts the calls of one block:
  0, and 1 for the second document of the dual encoder), the per-head output
  ``[B, N, H, K]``, the attention input length and the value outputs' shapes; the token
  embeddings in call order; and it adds ``value_delta`` (``[L, H, K]``, zero-padded or cut
  to each value output's length) to the values of the attention call ``target``, and
  ``embed_deltas[d]`` (``[B, L_d, E]``) to the ``d``-th embedding output.
  """

  def __init__(self, target: tuple[int, int] | None = None, value_delta=None,
               embed_deltas: Sequence[Any] | None = None):
    self.target, self.value_delta, self.embed_deltas = target, value_delta, embed_deltas
    self.calls: dict[int, int] = {}
    self.current: tuple[int, int] | None = None
    self.heads_out: dict[tuple[int, int], Any] = {}
    self.input_len: dict[tuple[int, int], int] = {}
    self.value_shapes: dict[tuple[int, int], tuple[int, ...]] = {}
    self.embeds: list[Any] = []

  def __call__(self, next_fun: Callable, args, kwargs, context):
    module = context.module
    if context.method_name != "__call__":
      return next_fun(*args, **kwargs)
    block = _block_of(module)
    if block is not None:
      return self._attention(block, module, next_fun, args, kwargs)
    parent_name = getattr(module.parent, "name", None)
    if self.current is not None and parent_name == "attention":
      if module.name == "out":
        self.heads_out[self.current] = args[0]
        return next_fun(*args, **kwargs)
      if module.name in VALUE_NAMES:
        out = next_fun(*args, **kwargs)
        self.value_shapes[self.current] = tuple(out.shape)
        if self.current == self.target and self.value_delta is not None:
          out = out + _fit_length(self.value_delta, out.shape[1])[None].astype(out.dtype)
        return out
    if module.name == "embed" and isinstance(module, nn.Embed) and isinstance(
        module.parent, encoders.Encoder):
      out = next_fun(*args, **kwargs)
      index = len(self.embeds)
      self.embeds.append(out)
      if self.embed_deltas is not None:
        out = out + self.embed_deltas[index].astype(out.dtype)
      return out
    return next_fun(*args, **kwargs)

  def _attention(self, block, module, next_fun, args, kwargs):
    call = self.calls.get(block, 0)
    self.calls[block] = call + 1
    key, outer = (block, call), self.current
    self.current = key
    self.input_len[key] = args[0].shape[1]
    try:
      out = next_fun(*args, **kwargs)
    finally:
      self.current = outer
    if key not in self.heads_out:   # no output projection: the output is the heads side by side
      heads = module.num_heads
      self.heads_out[key] = out.reshape(*out.shape[:2], heads, out.shape[-1] // heads)
    return out


def _fit_length(t_LxHxK, length: int):
  """``t`` zero-padded or cut along its first axis to ``length`` rows."""
  if t_LxHxK.shape[0] >= length:
    return t_LxHxK[:length]
  return jnp.pad(t_LxHxK, ((0, length - t_LxHxK.shape[0]), (0, 0), (0, 0)))


def sown_maps(apply_fn: Callable, params, batch: Mapping[str, np.ndarray]
              ) -> tuple[jnp.ndarray, dict[tuple[int, int], jnp.ndarray]]:
  """One deterministic forward pass that collects the maps the attention modules sow.

  Args:
    apply_fn: the classifier's ``apply`` (``state.apply_fn``).
    params: its parameters.
    batch: ``inputs``/``mask`` (and ``inputs2``/``mask2``) arrays ``[B, L]``.

  Returns:
    ``(logits [B, C] float32, {(block, call): map [B, H, N, L]})``; blocks whose variant
    sows nothing are absent.
  """
  logits, state = apply_fn({"params": params}, *model_args(batch), deterministic=True,
                           mutable=[base.MAPS])
  maps = {}
  for path, values in traverse_util.flatten_dict(dict(state.get(base.MAPS, {}))).items():
    blocks = [int(m.group(1)) for m in map(_BLOCK_RE.match, path) if m]
    if path[-1] != "map" or not blocks:
      continue
    for call, value in enumerate(values):
      maps[(blocks[-1], call)] = value
  return logits, maps


def _probe_shapes(apply_fn, params, args) -> _Probe:
  """A probe filled by an abstract forward pass (shapes only, nothing computed)."""
  probe = _Probe()

  def run():
    with nn.intercept_methods(probe):
      return apply_fn({"params": params}, *args, deterministic=True)

  jax.eval_shape(run)
  return probe


def value_jacobian_maps(apply_fn: Callable, params, batch: Mapping[str, np.ndarray],
                        keys: Sequence[tuple[int, int]] | None = None,
                        chunk: int = _JVP_CHUNK) -> dict[tuple[int, int], jnp.ndarray]:
  """The ``value_jacobian`` maps (module docstring) of one example.

  For attention call ``(block, call)`` the values of that call get a tangent at one
  position ``j`` (1 in every head and channel); the tangent of the per-head output row ``i``,
  averaged over the channels, is ``A_ij``. One JVP per position, ``chunk`` at a time.

  Args:
    apply_fn, params: the classifier.
    batch: one example (``B = 1``).
    keys: the ``(block, call)`` pairs to compute; None: every attention call.
    chunk: positions per vmapped JVP batch.

  Returns:
    ``{(block, call): [1, H, N, L]}`` float32, ``L`` the block's input length.

  Raises:
    ValueError: for a batch of more than one example, or a key the model does not have.
  """
  args = model_args(batch)
  if args[0].shape[0] != 1:
    raise ValueError(f"value_jacobian_maps explains one example, got a batch of "
                     f"{args[0].shape[0]}")
  shapes = _probe_shapes(apply_fn, params, args)
  keys = sorted(shapes.heads_out) if keys is None else list(keys)
  out = {}
  for key in keys:
    if key not in shapes.value_shapes:
      raise ValueError(f"attention call {key} (block, call) not found; the model has "
                       f"{sorted(shapes.value_shapes)}")
    _, _, heads, head_dim = shapes.value_shapes[key]
    length = shapes.input_len[key]

    def heads_of(delta, key=key):
      probe = _Probe(target=key, value_delta=delta)
      with nn.intercept_methods(probe):
        apply_fn({"params": params}, *args, deterministic=True)
      return probe.heads_out[key][0].astype(jnp.float32)   # [N, H, K]

    zeros = jnp.zeros((length, heads, head_dim), jnp.float32)
    _, jvp = jax.linearize(heads_of, zeros)
    parts = [_jvp_columns(jvp, jnp.arange(s, min(s + chunk, length)), zeros.shape)
             for s in range(0, length, chunk)]
    cols_LxNxH = jnp.concatenate(parts, axis=0)
    out[key] = jnp.transpose(cols_LxNxH, (2, 1, 0))[None]   # [1, H, N, L]
  return out


@jax.jit(static_argnums=(2,))
def _jvp_columns(jvp, positions, shape):
  """``[P, N, H]``: for each position ``j`` in ``positions``, the channel mean of the linear
  map ``jvp`` (a ``jax.linearize`` result, a pytree) at the tangent that is 1 at row ``j``."""

  def one(j):
    return jvp(jnp.zeros(shape, jnp.float32).at[j].set(1.0)).mean(axis=-1)

  return jax.vmap(one)(positions)


def gradient_x_input(apply_fn: Callable, params, batch: Mapping[str, np.ndarray],
                     target: int) -> list[np.ndarray]:
  """Gradient times input of logit ``target`` per token (module docstring).

  Args:
    apply_fn, params: the classifier.
    batch: one example (``B = 1``).
    target: the class whose logit is explained.

  Returns:
    One float32 array ``[L_d]`` per document (one, or two for the dual encoder), over the
    batch's input positions (pads included; a pad's relevance is that of its zero-weight
    embedding and is not meaningful).

  Raises:
    ValueError: for a batch of more than one example or a target outside ``[0, C)``.
  """
  args = model_args(batch)
  if args[0].shape[0] != 1:
    raise ValueError(f"gradient_x_input explains one example, got a batch of "
                     f"{args[0].shape[0]}")
  shapes = _probe_shapes(apply_fn, params, args)
  deltas = [jnp.zeros(e.shape, jnp.float32) for e in shapes.embeds]

  def logit(deltas, params, args):
    probe = _Probe(embed_deltas=deltas)
    with nn.intercept_methods(probe):
      logits = apply_fn({"params": params}, *args, deterministic=True)
    if not 0 <= target < logits.shape[-1]:
      raise ValueError(f"target class {target} outside [0, {logits.shape[-1]})")
    return logits[0, target], [e.astype(jnp.float32) for e in probe.embeds]

  grads, embeds = jax.jit(jax.grad(logit, has_aux=True))(deltas, params, args)
  return [np.asarray(jnp.sum(g * e, axis=-1)[0]) for g, e in zip(grads, embeds)]


@dataclasses.dataclass
class LayerMap:
  """One attention call's map for one example.

  Attributes:
    block: encoder block index.
    document: 0, or 1 for the second document of the dual encoder.
    attention: the block's registry name.
    method: a key of :data:`METHODS`.
    weights: ``[H, N, L]`` float32 numpy; rows are query positions, columns key positions
      of the block's sequence (CLS first under CLS pooling, pads at the end).
  """

  block: int
  document: int
  attention: str
  method: str
  weights: np.ndarray


@dataclasses.dataclass
class Explanation:
  """Everything :func:`explain` computes for one example.

  Attributes:
    logits: ``[C]`` float32.
    predicted: the argmax class.
    target: the class explained (the prediction unless asked otherwise).
    relevance: per document, ``[L_d]`` float32 gradient x input over input positions.
    maps: one :class:`LayerMap` per attention call, in block order.
    offset: sequence positions before the first input token (1: a CLS token is prepended).
  """

  logits: np.ndarray
  predicted: int
  target: int
  relevance: list[np.ndarray]
  maps: list[LayerMap]
  offset: int


def explain(model: nn.Module, apply_fn: Callable, params, batch: Mapping[str, np.ndarray],
            target: int | None = None) -> Explanation:
  """The maps and the relevance of one example.

  Args:
    model: the classifier (:func:`encoders.build_classifier`), for its encoder's settings.
    apply_fn: its ``apply`` (``state.apply_fn``, which merges LoRA weights).
    params: the parameters.
    batch: one example, ``B = 1``.
    target: the class to explain; None: the predicted one.

  Returns:
    An :class:`Explanation`.

  Raises:
    ValueError: from :func:`value_jacobian_maps` and :func:`gradient_x_input`.
  """
  logits, sown = sown_maps(apply_fn, params, batch)
  encoder = model.encoder
  names = encoder.config.layer_attentions()
  shapes = _probe_shapes(apply_fn, params, model_args(batch))
  keys = sorted(shapes.heads_out)
  missing = [k for k in keys if k not in sown]
  jac = value_jacobian_maps(apply_fn, params, batch, missing) if missing else {}
  maps = []
  for key in keys:
    block, call = key
    weights = sown[key] if key in sown else jac[key]
    method = method_of(names[block]) if key in sown else "value_jacobian"
    maps.append(LayerMap(block, call, names[block], method,
                         np.asarray(weights[0], np.float32)))
  logits = np.asarray(logits[0], np.float32)
  predicted = int(np.argmax(logits))
  target = predicted if target is None else int(target)
  relevance = gradient_x_input(apply_fn, params, batch, target)
  # A CLS token is prepended under CLS pooling, except with BERT's embeddings (whose [CLS] is
  # an input token) and in LRA's dual encoder (``prepend_cls=False``).
  offset = int(encoder.config.embedding_type != "bert"
               and encoder.config.classifier_pool == "CLS" and encoder.prepend_cls)
  return Explanation(logits, predicted, target, relevance, maps, offset)


def float32_model_config(model_config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """``model_config`` with ``dtype="float32"``: explanations are computed in float32 (the
  parameters are float32 whatever the activation dtype), so the maps are exact to float32."""
  out = ml_collections.ConfigDict(model_config.to_dict())
  out.dtype = "float32"
  return out
