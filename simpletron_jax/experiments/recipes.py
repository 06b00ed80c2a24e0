"""Each task's experiment facts: the published model and recipe, its ``:variant`` sizes, LRA's
per-baseline settings, the SimpleTRON and self-pretraining recipes (one :class:`TaskRecipe` per
task, keyed by the task's name in :mod:`simpletron_jax.data.tasks`).

``configs/lra.py`` builds every config from a task's data record and its recipe here, and an
attention's record (:mod:`simpletron_jax.experiments.attentions`);
:mod:`simpletron_jax.train.pretraining` reads the self-pretraining recipes. The published
accuracies are :mod:`simpletron_jax.experiments.published`'s. ``get(task)`` returns a recipe;
docs/tasks.md says how to add one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from simpletron_jax.data import tasks


@dataclasses.dataclass(frozen=True)
class ModelSize:
  """An encoder's sizes, in the field's names (those of ``config.model``).

  Attributes:
    emb_dim: the width of the token states (features).
    num_heads: attention heads per block.
    qkv_dim: the width of the queries, keys and values over all heads (features).
    mlp_dim: the hidden width of each block's MLP (features).
    num_layers: encoder blocks.
  """

  emb_dim: int
  num_heads: int
  qkv_dim: int
  mlp_dim: int
  num_layers: int


@dataclasses.dataclass(frozen=True)
class Recipe:
  """The optimisation of a task's published configs; the defaults are LRA's ListOps ones
  (``lra_benchmarks/listops/configs/base_listops_config.py``), which most tasks keep.

  Attributes:
    batch_size: examples per optimizer step (global).
    learning_rate: the peak rate of the schedule.
    factors: the schedule (:mod:`simpletron_jax.train.schedules`).
    warmup: linear-warmup steps (optimizer steps).
    num_train_steps: optimizer steps.
    eval_frequency: steps between validations.
    checkpoint_every: steps between checkpoints.
    weight_decay: AdamW's decoupled decay.
    grad_clip_norm: global-norm clipping; 0: none.
    adam_b1, adam_b2, adam_eps: Adam's constants.
  """

  batch_size: int = 32
  learning_rate: float = 0.05
  factors: str = "constant * linear_warmup * rsqrt_decay"
  warmup: int = 1000
  num_train_steps: int = 5000
  eval_frequency: int = 50
  checkpoint_every: int = 200
  weight_decay: float = 0.1
  grad_clip_norm: float = 0.0
  adam_b1: float = 0.9
  adam_b2: float = 0.98
  adam_eps: float = 1e-9

  @classmethod
  def by_epochs(cls, batch_size: int, train_examples: int, epochs: int,
                learning_rate: float, **fields) -> "Recipe":
    """LRA's image recipe (``lra_benchmarks/image/train.py``): cosine decay over ``epochs``
    epochs of ``train_examples // batch_size`` steps after a one-epoch warmup, validation and
    a checkpoint once an epoch, no weight decay; ``fields`` override the rest."""
    steps_per_epoch = train_examples // batch_size
    return cls(batch_size=batch_size, learning_rate=learning_rate,
               factors="constant * linear_warmup * cosine_decay", warmup=steps_per_epoch,
               num_train_steps=steps_per_epoch * epochs, eval_frequency=steps_per_epoch,
               checkpoint_every=steps_per_epoch, weight_decay=0.0, **fields)


@dataclasses.dataclass(frozen=True)
class Variant:
  """A task's own ``:variant`` of its configs (a CPU size such as ``:tiny``); unset fields
  (None, empty) keep the published config's values.

  Attributes:
    model: encoder sizes to change, by :class:`ModelSize` field name (a partial size keeps the
      attention's own sizes for the rest, as LRA's per-baseline image sizes).
    max_length: ``model.max_length`` (tokens, CLS excluded).
    batch_size, learning_rate: as :class:`Recipe`.
    num_train_steps, warmup: as :class:`Recipe` (optimizer steps).
    eval_frequency: steps between validations, and between checkpoints.
    num_eval_steps, num_test_steps: batches per validation and of the final test; -1: the
      whole split.
    options: any other config fields, by dotted name (``"data.num_images"``).
  """

  model: Mapping[str, int] = dataclasses.field(default_factory=dict)
  max_length: int | None = None
  batch_size: int | None = None
  learning_rate: float | None = None
  num_train_steps: int | None = None
  warmup: int | None = None
  eval_frequency: int | None = None
  num_eval_steps: int | None = None
  num_test_steps: int | None = None
  options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class LraBaseline:
  """One LRA baseline's own settings on a task (``lra_benchmarks/<task>/configs/
  <model_type>_base.py`` and the model files' defaults that ran), over the task's record.

  Attributes:
    model: ``config.model`` fields (sizes by :class:`ModelSize` names, dropout, pooling).
    attention_kwargs: ``config.model.attention_kwargs`` entries.
    options: other config fields by dotted name (``"weight_decay"``).
  """

  model: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  attention_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class SptRecipe:
  """One stage of Amos et al.'s self-pretraining recipe (``configs/experiment/lra/
  transformer-lra-<task>[-mlm].yaml`` of github.com/IdoAmos/not-from-scratch at f919137).

  Attributes:
    learning_rate: the constant rate after the warmup.
    weight_decay: AdamW's decoupled decay.
    warmup: linear-warmup steps.
    batch_size: examples per step.
    epochs: passes over :attr:`TaskRecipe.train_examples`.
  """

  learning_rate: float
  weight_decay: float
  warmup: int
  batch_size: int
  epochs: int



@dataclasses.dataclass(frozen=True)
class TaskRecipe:
  """The published configs of one task; ``configs/lra.py`` and ``pretraining`` read it
  (docs/tasks.md).

  Attributes:
    task: the task's name (its data record, ``config.task``).
    model: the published encoder (LRA's Transformer; BERT-base for ``agnews``).
    recipe: the published optimisation.
    source: where ``model``, ``recipe`` and the options come from.
    train_examples: training examples per epoch as the epoch-based recipes count them
      (:meth:`Recipe.by_epochs`, :class:`SptRecipe`); None where no recipe counts epochs.
    model_options: other ``config.model`` fields of the published config (dropout, pooling,
      positions, the BERT encoder's structure).
    variants: the task's own ``:variant`` suffixes (``tiny``, ...) by name, in order.
    lra_baselines: per LRA ``model_type`` (``AttentionRecipe.lra_model_type``), the baseline's
      own settings on this task.
    lra_baseline_max_length: ``model.max_length`` in LRA's code for every attention but
      SimpleTRON's (text: 1000); None: the task's ``max_length``.
    lra_code: config fields (dotted) that the ``:lra_code`` variant sets on this task beyond
      the shared ones (``configs/lra.apply_lra_code``).
    simpletron: the SimpleTRON paper's appendix A settings for ``simple*`` (dotted config
      fields; the shared AdamW and learned positions are added by ``configs/lra.py``); None
      where the paper has none, which also leaves out the ``:authors`` variants.
    pretraining: the self-pretraining recipe by stage, ``"spt"`` and ``"ft"``; empty where
      there is none, which leaves out the ``:spt`` variants.
  """

  task: str
  model: ModelSize
  recipe: Recipe
  source: str
  train_examples: int | None = None
  model_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  variants: Mapping[str, Variant] = dataclasses.field(default_factory=dict)
  lra_baselines: Mapping[str, LraBaseline] = dataclasses.field(default_factory=dict)
  lra_baseline_max_length: int | None = None
  lra_code: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  simpletron: Mapping[str, Any] | None = None
  pretraining: Mapping[str, SptRecipe] = dataclasses.field(default_factory=dict)


REGISTRY: dict[str, TaskRecipe] = {}


def register(recipe: TaskRecipe) -> TaskRecipe:
  """Adds ``recipe`` under its task's name.

  Raises:
    ValueError: if the task is not registered in :mod:`simpletron_jax.data.tasks` (naming
      the known tasks), or already has a recipe.
  """
  tasks.get(recipe.task)
  if recipe.task in REGISTRY:
    raise ValueError(f"task {recipe.task!r} already has a recipe")
  REGISTRY[recipe.task] = recipe
  return recipe


def get(task: str) -> TaskRecipe:
  """The recipe of ``task``.

  Raises:
    ValueError: one line naming the config field ``task`` and the known tasks, for a task
      that is not registered or has no recipe.
  """
  tasks.get(task)
  try:
    return REGISTRY[task]
  except KeyError:
    raise ValueError(f"task={task!r} has no experiments recipe; with one: "
                     f"{', '.join(sorted(REGISTRY))}") from None


# The CPU size of the Nystromformer LRA setup (Xiong et al., 2021): 2 layers, emb 64, 2 heads,
# qkv 64, mlp 128.
_TINY_MODEL = {"emb_dim": 64, "num_heads": 2, "qkv_dim": 64, "mlp_dim": 128, "num_layers": 2}

_TEXT_TINY = Variant(model=_TINY_MODEL, learning_rate=0.05, max_length=512,
                     num_train_steps=500, warmup=100, eval_frequency=250, num_eval_steps=16,
                     num_test_steps=128)
_LISTOPS_TINY_LRA = Variant(model=_TINY_MODEL, learning_rate=0.05, num_train_steps=5000,
                            warmup=1000, eval_frequency=200, num_eval_steps=-1,
                            num_test_steps=-1)
_AGNEWS_TINY = Variant(model=_TINY_MODEL, max_length=64, batch_size=32, learning_rate=1e-3,
                       num_train_steps=500, warmup=50, eval_frequency=250, num_eval_steps=16,
                       num_test_steps=-1, options={"model.max_positions": 64})
AGNEWS_FROM_BERT = ("set --config.init_from to the folder written by python -m "
                    "simpletron_jax.tools.bert_import BERT_DIR OUT_DIR (docs/bert.md)")
"""``init_from`` of the ``agnews`` ``:from_bert`` variants until the user sets it: a run stops
on it, naming what to do."""


register(TaskRecipe(
    task="listops",
    model=ModelSize(emb_dim=512, num_heads=8, qkv_dim=512, mlp_dim=1024, num_layers=4),
    recipe=Recipe(),
    source="LRA listops/configs/base_listops_config.py: batch 32, lr 0.05 rsqrt, warmup "
           "1000, 5000 steps, 4 x 512 model, max_length 2000; data from the seeded generator",
    train_examples=96000,
    variants={
        # 20 < tokens < 200: the range of the original ListOps (Nangia & Bowman, 2018).
        "tiny": dataclasses.replace(_LISTOPS_TINY_LRA, max_length=200, options={
            "data.min_tokens": 20, "data.max_tokens": 200, "data.bucket": 32}),
        "tiny_lra": _LISTOPS_TINY_LRA},
    # listops/configs/performer_base.py: FAVOR+ softmax with 2 features, redrawn every call.
    lra_baselines={"performer": LraBaseline(attention_kwargs={
        "kernel": "softmax", "num_features": 2, "redraw": True, "lra_masking": False})},
    simpletron={"learning_rate": 0.005, "num_train_steps": 15000, "model.num_layers": 6,
                "model.mlp_dim": 2048},
    pretraining={"spt": SptRecipe(0.05, 0.0, 2000, 32, 100),
                 "ft": SptRecipe(0.05, 0.0, 2000, 32, 100)},
))

register(TaskRecipe(
    task="text",
    model=ModelSize(emb_dim=256, num_heads=4, qkv_dim=256, mlp_dim=1024, num_layers=4),
    recipe=Recipe(num_train_steps=20000, warmup=8000, eval_frequency=100,
                  checkpoint_every=500),
    source="LRA text_classification/configs/base_tc_config.py: IMDB bytes, 20000 steps, "
           "warmup 8000, 4 x 256 model, validation every 100 steps; max_length 4000 as in the "
           "LRA paper and SimpleTRON (LRA's code: 1000, lra_baseline_max_length)",
    train_examples=25000,
    variants={"tiny": _TEXT_TINY},
    lra_baseline_max_length=1000,
    lra_code={"data.val_fraction": 0.0},
    simpletron={},
    pretraining={"spt": SptRecipe(0.05, 0.1, 5000, 32, 32),
                 "ft": SptRecipe(0.05, 0.1, 2000, 32, 65)},
))

register(TaskRecipe(
    task="retrieval",
    model=ModelSize(emb_dim=128, num_heads=4, qkv_dim=128, mlp_dim=512, num_layers=4),
    recipe=Recipe(num_train_steps=5000, warmup=8000, eval_frequency=100,
                  checkpoint_every=500),
    source="LRA matching/configs/base_match_config.py: AAN pairs, 5000 steps, warmup 8000, "
           "4 x 128 model, 4000 bytes per document",
    model_options={
        # LRA's code: classifier_head_dual(interaction=None), i.e. [u, v]; "nli" is the LRA
        # paper's [u, v, u * v, u - v].
        "interaction": "concat",
        # True: LRA's TransformerDualEncoder, whose encoders have no CLS token, so "CLS"
        # pooling reads the first real token (a bug; docs/lra_parity.md).
        "lra_dual_no_cls": False},
    variants={"tiny": _TEXT_TINY},
    simpletron={"num_train_steps": 15000},
))

_CIFAR10_TRAIN = 45000   # CIFAR-10's 50,000 training images less the 10% validation
register(TaskRecipe(
    task="image",
    model=ModelSize(emb_dim=128, num_heads=8, qkv_dim=64, mlp_dim=128, num_layers=1),
    recipe=Recipe.by_epochs(256, _CIFAR10_TRAIN, 200, 5e-4),
    source="LRA image/configs/cifar10/{base_cifar10_config,transformer_base}.py: CIFAR-10 "
           "grayscale, batch 256, 200 epochs of 45,000 images, lr 5e-4 cosine, 1 x 128 model "
           "with 8 heads, qkv 64, mlp 128, dropout 0.3 / 0.2, CLS pooling, learned positions",
    train_examples=_CIFAR10_TRAIN,
    model_options={"dropout_rate": 0.3, "attention_dropout_rate": 0.2, "learn_pos_emb": True},
    variants={"tiny": Variant(
        model={"emb_dim": 64, "num_heads": 2, "qkv_dim": 64, "mlp_dim": 128, "num_layers": 1},
        batch_size=32, learning_rate=1e-3, num_train_steps=500, warmup=100,
        eval_frequency=250, num_eval_steps=16, num_test_steps=-1)},
    # image/configs/cifar10/<model_type>_base.py over base_cifar10_config.py (emb 32, 1 head,
    # 1 layer, qkv 32, mlp 64, dropout 0.3, CLS).
    lra_baselines={
        "transformer": LraBaseline({"num_layers": 1, "num_heads": 8, "emb_dim": 128,
                                    "qkv_dim": 64, "mlp_dim": 128}),
        # bigbird_base.py sets ``config.model.num_head = 4``, a misspelt field that LRA's
        # image train.py passes to the model, which raises (TypeError), so LRA's image BigBird
        # never ran from that config; these are its sizes with the misspelt field dropped
        # (1 head).
        "bigbird": LraBaseline({"num_layers": 1, "num_heads": 1, "emb_dim": 128,
                                "qkv_dim": 64, "mlp_dim": 128}, {"block_size": 64}),
        "linear_transformer": LraBaseline({"num_layers": 1, "num_heads": 8, "emb_dim": 128,
                                           "qkv_dim": 64, "mlp_dim": 128}),
        "linformer": LraBaseline({"num_layers": 1, "num_heads": 8, "emb_dim": 128,
                                  "qkv_dim": 64, "mlp_dim": 128}),
        "local": LraBaseline({"num_layers": 1, "num_heads": 2, "emb_dim": 128, "qkv_dim": 64,
                              "mlp_dim": 128, "classifier_pool": "MEAN"}, {"block_size": 64}),
        "longformer": LraBaseline({"num_layers": 4, "num_heads": 4, "emb_dim": 128,
                                   "qkv_dim": 64, "mlp_dim": 128, "classifier_pool": "MEAN"}),
        "performer": LraBaseline({"num_layers": 1, "num_heads": 8, "emb_dim": 128,
                                  "qkv_dim": 64, "mlp_dim": 128}),
        "reformer": LraBaseline({"num_layers": 4, "num_heads": 8, "emb_dim": 64,
                                 "qkv_dim": 32, "mlp_dim": 64}),
        # sinkhorn_base.py keeps the base sizes, sets dropout 0.1 and weight_decay 0.7.
        "sinkhorn": LraBaseline({"num_layers": 1, "num_heads": 1, "emb_dim": 32,
                                 "qkv_dim": 32, "mlp_dim": 64, "dropout_rate": 0.1},
                                {"block_size": 64}, {"weight_decay": 0.7}),
        "sparse_transformer": LraBaseline({"num_layers": 1, "num_heads": 8, "emb_dim": 128,
                                           "qkv_dim": 64, "mlp_dim": 128}),
        "synthesizer": LraBaseline({"num_layers": 1, "num_heads": 8, "emb_dim": 128,
                                    "qkv_dim": 64, "mlp_dim": 128}),
    },
    pretraining={"spt": SptRecipe(1e-3, 0.0, 2500, 32, 50),
                 "ft": SptRecipe(1e-3, 0.0, 2000, 50, 200)},
))

_PATHFINDER_TRAIN = 160000   # 80% of the 200,000 images of a level
register(TaskRecipe(
    task="pathfinder",
    model=ModelSize(emb_dim=32, num_heads=4, qkv_dim=16, mlp_dim=32, num_layers=4),
    recipe=Recipe.by_epochs(512, _PATHFINDER_TRAIN, 200, 1e-3),
    source="LRA image/configs/pathfinder32/{base_pathfinder32_config,transformer_base}.py: "
           "batch 512, 200 epochs of 160,000 images, lr 1e-3 cosine, 4 x 32 model with 4 "
           "heads, qkv 16, mlp 32, dropout 0.2 / 0.1, MEAN pooling, sinusoidal positions",
    train_examples=_PATHFINDER_TRAIN,
    model_options={"dropout_rate": 0.2, "classifier_pool": "MEAN"},
    # LRA's model cut to 1 layer and 2 heads, so that its softmax has as many L x L scores per
    # example as the image tiny model.
    variants={"tiny": Variant(model={"num_layers": 1, "num_heads": 2}, batch_size=32,
                              num_train_steps=500, warmup=100, eval_frequency=250,
                              num_eval_steps=-1, num_test_steps=-1,
                              options={"data.num_images": 10000})},
    # image/configs/pathfinder32/<model_type>_base.py over base_pathfinder32_config.py (emb
    # 32, 2 heads, 1 layer, qkv 16, mlp 32, dropout 0.1, MEAN, sinusoidal positions).
    lra_baselines={
        "transformer": LraBaseline({"num_layers": 4, "num_heads": 4, "emb_dim": 32,
                                    "qkv_dim": 16, "mlp_dim": 32, "dropout_rate": 0.2}),
        "bigbird": LraBaseline({"num_layers": 4, "num_heads": 2, "emb_dim": 64, "qkv_dim": 32,
                                "mlp_dim": 64, "dropout_rate": 0.2}, {"block_size": 64}),
        "linear_transformer": LraBaseline({"num_layers": 1, "num_heads": 2, "emb_dim": 128,
                                           "qkv_dim": 64, "mlp_dim": 128,
                                           "dropout_rate": 0.2}),
        "linformer": LraBaseline({"num_layers": 1, "num_heads": 2, "emb_dim": 32,
                                  "qkv_dim": 16, "mlp_dim": 32, "dropout_rate": 0.2}),
        "local": LraBaseline({"num_layers": 2, "num_heads": 4, "emb_dim": 64, "qkv_dim": 32,
                              "mlp_dim": 64, "dropout_rate": 0.1}, {"block_size": 64}),
        "longformer": LraBaseline({"num_layers": 2, "num_heads": 2, "emb_dim": 32,
                                   "qkv_dim": 16, "mlp_dim": 32, "dropout_rate": 0.1}),
        "performer": LraBaseline({"num_layers": 4, "num_heads": 8, "emb_dim": 32,
                                  "qkv_dim": 16, "mlp_dim": 32, "dropout_rate": 0.2}),
        "reformer": LraBaseline({"num_layers": 2, "num_heads": 8, "emb_dim": 64,
                                 "qkv_dim": 32, "mlp_dim": 64, "dropout_rate": 0.2}),
        "sinkhorn": LraBaseline({"num_layers": 2, "num_heads": 4, "emb_dim": 32,
                                 "qkv_dim": 16, "mlp_dim": 64, "dropout_rate": 0.2},
                                {"block_size": 64}),
        "sparse_transformer": LraBaseline({"num_layers": 1, "num_heads": 8, "emb_dim": 32,
                                           "qkv_dim": 16, "mlp_dim": 32,
                                           "dropout_rate": 0.2}),
        "synthesizer": LraBaseline({"num_layers": 2, "num_heads": 4, "emb_dim": 64,
                                    "qkv_dim": 32, "mlp_dim": 64, "dropout_rate": 0.2}),
    },
    pretraining={"spt": SptRecipe(5e-4, 0.0, 2500, 32, 50),
                 "ft": SptRecipe(5e-4, 0.0, 5000, 32, 200)},
))

register(TaskRecipe(
    task="pathx",
    model=ModelSize(emb_dim=32, num_heads=2, qkv_dim=16, mlp_dim=32, num_layers=1),
    recipe=Recipe.by_epochs(64, _PATHFINDER_TRAIN, 200, 1e-3, grad_clip_norm=1.0),
    source="LRA image/configs/pathfinder128/base_pathfinder128_config.py (Path-X): batch 64, "
           "200 epochs of 160,000 images, lr 1e-3 cosine, gradient clipping 1.0, 1 x 32 model "
           "with 2 heads, qkv 16, mlp 32, MEAN pooling, learned positions, 16,384 tokens; "
           "LRA has only a Transformer config for it, so every baseline keeps these sizes",
    train_examples=_PATHFINDER_TRAIN,
    model_options={"classifier_pool": "MEAN", "learn_pos_emb": True},
    # A smoke test of 16,384-token training, not a result.
    variants={"tiny": Variant(batch_size=8, num_train_steps=200, warmup=50, eval_frequency=100,
                              num_eval_steps=25, num_test_steps=25,
                              options={"data.num_images": 2000})},
    pretraining={"spt": SptRecipe(5e-4, 0.0, 5000, 32, 200),
                 "ft": SptRecipe(5e-4, 0.0, 5000, 32, 200)},
))

register(TaskRecipe(
    task="agnews",
    model=ModelSize(emb_dim=768, num_heads=12, qkv_dim=768, mlp_dim=3072, num_layers=12),
    # 35,625 steps = 10 epochs of the 114,000 training articles at batch 32, 10% warmup.
    recipe=Recipe(num_train_steps=35625, warmup=3562, eval_frequency=1000,
                  checkpoint_every=1000, learning_rate=5e-5,
                  factors="constant * linear_warmup * cosine_decay", weight_decay=1e-3,
                  adam_b2=0.999, adam_eps=1e-8),
    source="SimpleTRON section 5.3 (12 blocks, width 768, 12 heads, MLP 3072, CLS pooling, "
           "learned positions, GELU), the SimpleTRON authors' AG News code (ag/: dropout 0.2, "
           "AdamW lr 5e-5, (0.9, 0.999), eps 1e-8, weight decay 1e-3, batch 32, about 10 "
           "epochs with a 10% warmup) and BERT (Devlin et al., 2019) for the rest; docs/bert.md",
    train_examples=114000,
    model_options={
        "max_positions": 512,           # BERT's position table
        "dropout_rate": 0.2, "attention_dropout_rate": 0.2, "learn_pos_emb": True,
        "classifier_pool": "CLS",       # BERT's [CLS] token, position 0
        "head": "dense", "embedding_type": "bert", "type_vocab_size": 2,
        "block_norm": "post", "pooler": True, "final_layer_norm": False,
        "layer_norm_epsilon": 1e-12, "mlp_hidden_dropout": False, "attention_bias": True,
        "mlp_activation": "gelu_exact"},
    variants={"tiny": _AGNEWS_TINY,
              "from_bert": Variant(options={"init_from": AGNEWS_FROM_BERT}),
              "tiny_from_bert": dataclasses.replace(_AGNEWS_TINY, options={
                  **_AGNEWS_TINY.options, "init_from": AGNEWS_FROM_BERT})},
))