"""Config builder for every (task, attention) pair: LRA's settings, SimpleTRON's where it has them.

Each file ``configs/<task>/<model>.py`` is one call to :func:`make_config`, which builds the
config from the task's data record (:class:`simpletron_jax.data.tasks.TaskSpec`), its recipe
(:class:`simpletron_jax.experiments.recipes.TaskRecipe`; docs/tasks.md), the attention's
record (:class:`simpletron_jax.experiments.attentions.AttentionRecipe`) and the rules below.
The settings come as docs/configs.md gives them:

* LRA's code configs (``lra_benchmarks/<task>/configs/base_*_config.py`` and
  ``transformer_base.py``) for every task, and for the LRA baselines their per-variant
  settings (``<model_type>_base.py`` and the model files' defaults that actually ran), see
  :func:`_lra_variant_settings`; the departures that remain are listed in docs/fidelity.md;
* SimpleTRON's appendix A for ``simple``, ``simple_res`` and ``simple_resl`` on ListOps, text
  and retrieval (the paper has no image or Pathfinder settings, so there the simple variants
  use LRA's, with ``qkv_dim`` raised to ``emb_dim`` where LRA's is smaller because ``simple``
  and ``simple_res`` have no output projection).
* ``local`` has LRA's strided groups and LRA's pooling (CLS, MEAN where LRA's image configs
  set it); ``sparse`` makes position 0 global exactly when the pooling is CLS (LRA's
  ``use_cls_token``).

A ``:variant`` suffix on the config path selects a CPU size, or (``:authors``,
``:tiny_authors``) the SimpleTRON authors' function, see :func:`apply_variant`.
"""

from __future__ import annotations

import ml_collections

from simpletron_jax.data import tasks
from simpletron_jax.experiments import attentions, recipes
from simpletron_jax.model import attention as attention_registry

# The SimpleTRON authors' function (``_authors``), for simple* on the tasks whose record has
# SimpleTRON's settings (``TaskRecipe.simpletron``).
AUTHORS_VARIANTS = {"authors": None, "tiny_authors": "tiny"}  # -> the size variant used
# The function LRA's code computed, bugs included (:func:`apply_lra_code`), for the LRA
# baselines (``attentions.lra_baselines()``) on LRA's tasks.
LRA_CODE_VARIANTS = {"lra_code": None, "tiny_lra_code": "tiny"}  # -> the size variant used
# Self-pretraining (Amos et al., 2024; simpletron_jax/train/pretraining.py): the pretraining stage
# (masked-token denoising on the task's training split) and the fine-tuning stage (the
# classifier with the [MASK] row reserved, run with --config.init_from=<pretraining run>),
# at the published size or ``tiny``, on the tasks whose record has a recipe
# (``TaskRecipe.pretraining``; not retrieval: two documents, not supported yet).
SPT_VARIANTS = {"spt": (None, "mlm"), "tiny_spt": ("tiny", "mlm"),
                "spt_ft": (None, "none"), "tiny_spt_ft": ("tiny", "none")}


def task_variants(task: str) -> tuple[str, ...]:
  """Every ``:variant`` suffix of ``task``: its recipe's own (``TaskRecipe.variants``), then
  :data:`AUTHORS_VARIANTS` where the record has SimpleTRON's settings,
  :data:`LRA_CODE_VARIANTS` on LRA's tasks and :data:`SPT_VARIANTS` where it has a
  self-pretraining recipe.

  Raises:
    ValueError: for an unknown task (naming the config field ``task``).
  """
  spec, recipe = tasks.get(task), recipes.get(task)
  found = tuple(recipe.variants)
  if recipe.simpletron is not None:
    found += tuple(AUTHORS_VARIANTS)
  if spec.lra:
    found += tuple(LRA_CODE_VARIANTS)
  if recipe.pretraining:
    found += tuple(SPT_VARIANTS)
  return found


def variants(task: str, attention: str) -> tuple[str, ...]:
  """The ``:variant`` suffixes valid for ``attention`` on ``task`` (the ``AUTHORS_VARIANTS``
  only for SimpleTRON's variants, ``AttentionRecipe.simpletron``, the ``LRA_CODE_VARIANTS``
  only for the LRA baselines, those with an ``AttentionRecipe.lra_model_type``)."""
  skip = set()
  recipe = attentions.get(attention)
  if not recipe.simpletron:
    skip |= set(AUTHORS_VARIANTS)
  if recipe.lra_model_type is None:
    skip |= set(LRA_CODE_VARIANTS)
  return tuple(v for v in task_variants(task) if v not in skip)


def _set(config: ml_collections.ConfigDict, field: str, value) -> None:
  """Sets the dotted ``field`` (``"data.num_images"``) of ``config``; a type (``str``,
  ``bool``) sets an unset field (None) of that type."""
  *sections, name = field.split(".")
  holder = config
  for section in sections:
    holder = holder[section]
  if isinstance(value, type):
    value = ml_collections.config_dict.placeholder(value)
  holder[name] = value


def _set_all(config: ml_collections.ConfigDict, fields, prefix: str = "") -> None:
  """:func:`_set` for every ``name: value`` of ``fields``, each name under ``prefix``."""
  for name, value in fields.items():
    _set(config, prefix + name, value)


def _common(spec: tasks.TaskSpec) -> ml_collections.ConfigDict:
  """Every field of a run config, with the task's published recipe, sizes, ``max_length``
  and data section (:func:`simpletron_jax.data.tasks.data_section`) from its record ``spec``;
  :func:`make_config` adds the recipe's other model fields (``TaskRecipe.model_options``)."""
  recipe, size = recipes.get(spec.name).recipe, recipes.get(spec.name).model
  config = ml_collections.ConfigDict()
  config.task = spec.name
  config.seed = 0

  config.batch_size = recipe.batch_size  # examples per optimizer step (global)
  config.grad_accum_steps = 1       # micro-steps per optimizer step
  config.eval_batch_size = 0        # 0: the micro-batch size
  config.num_train_steps = recipe.num_train_steps  # optimizer steps
  config.num_eval_steps = -1        # batches per validation; -1: the whole split
  config.num_test_steps = -1        # batches of the final test; -1: the whole split
  config.eval_frequency = recipe.eval_frequency  # steps between validations
  config.checkpoint_every = recipe.checkpoint_every  # steps between checkpoints
  config.max_to_keep = 2             # newest checkpoints kept, besides the best
  config.best_metric = "accuracy"   # the validation metric that picks the best checkpoint
  config.best_mode = "max"          # "max" or "min" (for best_metric "loss")
  config.log_every = 10             # steps between train-metric records
  config.max_train_minutes = 0.0    # wall-clock budget per invocation; 0: none
  # How the run is executed and reported, not what it computes (run_record.RESUME_ALLOWED_FIELDS).
  config.parallelism = "pmap"       # "pmap" (LRA's) or "jit" (jax.jit over a device Mesh)
  config.async_checkpoints = False  # orbax saves in a background thread (docs/faults.md)
  config.wandb = ml_collections.ConfigDict()
  config.wandb.project = ""         # "": no Weights & Biases logging
  config.wandb.entity = ""          # "": the W&B account's default
  config.wandb.mode = ""            # "": W&B's WANDB_MODE (online if unset); "online"; "offline"

  # Weight surgery (simpletron_jax/model/transfer.py, lora.py); the papers' experiments.
  config.init_from = ""             # a train.py workdir: start from its best checkpoint's params
  config.init_include = ()          # regexes of parameter paths to copy; empty: every match
  config.freeze = ()                # regexes of parameter paths left untrained
  config.lora = ml_collections.ConfigDict()
  config.lora.rank = 0              # 0: no LoRA; else adapters of this rank, base frozen
  config.lora.alpha = 0.0           # scale alpha / rank; 0: alpha = rank
  config.lora.targets = ("attention/(query|key|value|out)/kernel$",)

  config.learning_rate = recipe.learning_rate
  config.factors = recipe.factors
  config.warmup = recipe.warmup     # steps
  config.weight_decay = recipe.weight_decay
  config.grad_clip_norm = recipe.grad_clip_norm  # global-norm clipping; 0: none
  config.adam_b1 = recipe.adam_b1
  config.adam_b2 = recipe.adam_b2
  config.adam_eps = recipe.adam_eps

  # The reader's fields (the task's record); data.seed follows config.seed until it is set.
  config.data = tasks.data_section(spec, config.get_ref("seed"))

  config.model = ml_collections.ConfigDict()
  config.model.attention = "softmax"
  config.model.attention_kwargs = ml_collections.ConfigDict()
  config.model.attention_per_layer = ()  # one name per block; empty: model.attention in all
  config.model.emb_dim = size.emb_dim
  config.model.num_heads = size.num_heads
  config.model.qkv_dim = size.qkv_dim
  config.model.mlp_dim = size.mlp_dim
  config.model.num_layers = size.num_layers
  config.model.max_length = spec.max_length  # tokens, CLS excluded
  config.model.dropout_rate = 0.1
  config.model.attention_dropout_rate = 0.1
  config.model.learn_pos_emb = False
  config.model.classifier_pool = "CLS"
  config.model.head = "mlp"         # classifier head: mlp (LRA) | dense (LRA's Sinkhorn)
  config.model.attention_bias = False  # biases on q/k/v/out (LRA: none; the authors: yes)
  # LRA's bugs, as options (docs/lra_parity.md): MEAN pooling over the pads too.
  config.model.lra_mean_over_pads = False
  config.model.lra_cls_mask = False    # CLS takes the first token's padding mask
  config.model.last_block_cls_only = False  # CLS pooling: last block on position 0 only
  config.model.length_multiple = 1  # pad L (+ CLS) to a multiple of this with masked positions
  config.model.dtype = "float32"
  # Options that reproduce the SimpleTRON authors' code (``_authors``); defaults are LRA's.
  config.model.pos_emb_init = "normal"          # learned positions: normal(0.02) | zeros
  config.model.embedding_dropout = True         # dropout on the embeddings
  config.model.attention_branch_dropout = True  # dropout on the block's attention branch
  config.model.final_layer_norm = True          # LayerNorm after the last block
  config.model.zero_pad_embedding = False       # token 0 embeds to zero (torch padding_idx)
  config.model.head_activation = "relu"         # classifier head: relu | gelu
  config.model.mlp_activation = "gelu_tanh"     # block MLP: gelu_tanh (flax, LRA) | gelu_exact
  config.model.cls_position = True              # CLS gets position 0 (False: no position)
  config.model.dense_init = "lra"              # Dense init: lra | torch (nn.Linear's)
  return config


def apply_simpletron_paper(config: ml_collections.ConfigDict) -> None:
  """SimpleTRON appendix A (ListOps, text, matching): AdamW (0.9, 0.999), learned
  positions, and per task:

  * ListOps: 6 blocks, 8 heads, 512 / 512 / 2048, lr 0.005, warmup 1000, 15000 steps.
  * Text: 4 blocks, 4 heads, 256 / 256 / 1024, lr 0.05, warmup 8000, 20000 steps, L 4000.
  * Matching: 4 blocks, 4 heads, 128 / 128 / 512, lr 0.05, warmup 8000, 15000 steps, L 4000.

  The per-task values are the recipe's ``TaskRecipe.simpletron``; tasks whose recipe has none
  are left unchanged (the paper has no settings for them).
  """
  settings = recipes.get(config.task).simpletron
  if settings is None:
    return
  config.adam_b2 = 0.999
  config.adam_eps = 1e-8
  config.model.learn_pos_emb = True
  _set_all(config, settings)


# --- LRA's per-variant settings (read from lra_benchmarks/*/configs/ at commit cd31e5c) -----
def _lra_variant_settings(config) -> None:
  """LRA's per-variant settings for the LRA baselines (``attentions.lra_baselines()``).

  * Attention options: the options LRA's code ran for the variant on every task
    (``AttentionRecipe.lra_options``), under the task recipe's own for the baseline. The
    ``lra_masking=False`` of linear, Performer and Linformer and the ``lra_bugs=False`` of
    local, sparse, BigBird and Reformer are present so that
    ``--config.model.attention_kwargs.lra_masking=True`` (``lra_bugs=True``) can switch on
    LRA's missing padding mask (its bugs).
  * ``max_length`` in LRA's code where the record has one of its own
    (``TaskRecipe.lra_baseline_max_length``: text's 1000,
    ``text_classification/configs/base_tc_config.py``) for every attention but
    SimpleTRON's variants, which keep SimpleTRON's (text: 4000).
  * Each baseline's own sizes, dropout, pooling, block size and other fields where the
    task's recipe has them (``TaskRecipe.lra_baselines``: image and Pathfinder-32,
    ``image/configs/{cifar10,pathfinder32}/<model_type>_base.py``; ListOps's Performer).
    Path-X has only a Transformer config in LRA: every variant uses its base sizes.
  """
  spec, recipe = tasks.get(config.task), recipes.get(config.task)
  attention = attentions.get(config.model.attention)
  if recipe.lra_baseline_max_length is not None and not attention.simpletron:
    config.model.max_length = recipe.lra_baseline_max_length
  model_type = attention.lra_model_type
  if model_type is None:
    return
  baseline = recipe.lra_baselines.get(model_type, recipes.LraBaseline())
  _set_all(config, baseline.model, "model.")
  for key, value in baseline.attention_kwargs.items():
    config.model.attention_kwargs[key] = value
  _set_all(config, baseline.options)
  if not spec.dual:   # LRA's own encoder for the baseline (Sinkhorn's), one-input tasks
    _set_all(config, attention.lra_encoder, "model.")
  for key, value in attention.lra_options.items():
    if key not in baseline.attention_kwargs:
      config.model.attention_kwargs[key] = value


# --- The SimpleTRON authors' function (docs/fidelity.md) ------------------------------------
def _authors(config, paper_size: bool = True) -> None:
  """What the SimpleTRON authors' code computed (``vladyorsh/lra_efficient_transformers``,
  ``lra/notebooks/listops_setup_simple_2.ipynb`` and ``bpe_matching_setup_simple_2.ipynb``):

  * ``SimpleAttention``: pads enter ``K^T V`` (``mask_pads=False``), the normaliser is
    ``sqrt`` of the padded length (``normalizer="padded"``), dropout 0.1 on ``K^T V``;
  * every batch padded to ``max_length`` (``data.bucket=0``), so that length is
    ``max_length + 1`` with CLS;
  * ``nn.Linear`` projections with biases (``model.attention_bias``);
  * ``TBlock``: no dropout on the attention branch, torch's exact ``nn.GELU()`` in the MLP
    (``model.mlp_activation="gelu_exact"``); ``TEmbedding``: no embedding dropout,
    learned positions initialised to zeros, ``nn.Embedding(padding_idx=0)`` (pad embeds
    to zero), positions added before CLS is prepended, so CLS has none and the table has
    ``max_length`` rows (``model.cls_position=False``);
  * every ``nn.Linear`` (q/k/v, MLP, head) with torch's default init
    (``model.dense_init="torch"``);
    the embedding's N(0, 1) and the LayerNorm epsilon 1e-6 are already the defaults;
  * ListOps and text: ``TClassifier``'s GELU head after a final LayerNorm; matching:
    ``DualClassifier`` on ``[u, v]`` with ReLU, no final LayerNorm, and at the paper's
    size 8 heads (``SimpleAttention(128, 128, 8, 0.1)``; ``paper_size=False`` keeps the
    size variant's heads).
  """
  kwargs = config.model.attention_kwargs
  kwargs.normalizer = "padded"
  kwargs.mask_pads = False
  kwargs.kv_dropout_rate = 0.1
  config.data.bucket = 0
  model = config.model
  model.attention_bias = True       # torch nn.Linear
  model.learn_pos_emb = True
  model.pos_emb_init = "zeros"
  model.embedding_dropout = False
  model.attention_branch_dropout = False
  model.zero_pad_embedding = True
  model.mlp_activation = "gelu_exact"
  model.cls_position = False
  model.dense_init = "torch"
  model.head_activation = "gelu"
  if tasks.get(config.task).dual:
    model.head_activation = "relu"
    model.final_layer_norm = False
    model.interaction = "concat"
    if paper_size:
      model.num_heads = 8


def _apply_task_variant(config: ml_collections.ConfigDict, variant: recipes.Variant) -> None:
  """Sets the fields a task's own variant (``TaskRecipe.variants``) changes; ``eval_frequency``
  sets ``checkpoint_every`` too."""
  _set_all(config, variant.model, "model.")
  if variant.max_length is not None:
    config.model.max_length = variant.max_length
  for field in ("batch_size", "learning_rate", "num_train_steps", "warmup", "eval_frequency",
                "num_eval_steps", "num_test_steps"):
    if getattr(variant, field) is not None:
      config[field] = getattr(variant, field)
  if variant.eval_frequency is not None:
    config.checkpoint_every = variant.eval_frequency
  _set_all(config, variant.options)


def apply_variant(config: ml_collections.ConfigDict, variant: str | None):
  """Applies a ``:variant`` suffix (:func:`task_variants`); every task has ``tiny``, a CPU run
  of minutes.

  * A task's own variants (``tiny``, ListOps's ``tiny_lra``, AG News's ``from_bert`` and
    ``tiny_from_bert``): the fields of its record's
    :class:`simpletron_jax.experiments.recipes.Variant`
    (docs/tasks.md describes each).
  * ``spt`` and ``tiny_spt`` (the tasks with a self-pretraining recipe): self-pretraining
    (Amos et al., ICLR 2024), the paper size or ``tiny`` with ``config.pretrain``
    (masked-token denoising at rate 0.5 on the training split;
    :mod:`simpletron_jax.train.pretraining`); ``spt_ft`` and ``tiny_spt_ft``: the classifier that
    fine-tunes from it (``--config.init_from=<spt run>``), with the [MASK] embedding row
    reserved so the embedding transfers. ``spt`` and ``spt_ft`` train with the SPT code's
    recipe for the task and stage (:func:`simpletron_jax.train.pretraining.apply_paper_recipe`: lr,
    weight decay, warmup then constant, batch, epochs, no dropout) on LRA's encoder; the
    ``tiny`` ones keep ``tiny``'s schedule.
  * ``authors`` and ``tiny_authors`` (the tasks with SimpleTRON's settings: ListOps, text,
    retrieval; ``simple``, ``simple_res``, ``simple_resl`` only): the paper size or ``tiny``,
    computing the SimpleTRON authors' function (:func:`_authors`), to compare with the
    published numbers.
  * ``lra_code`` and ``tiny_lra_code`` (LRA's tasks; the baselines of
    ``attentions.lra_baselines()``): the paper size or ``tiny`` with LRA's bugs
    (:func:`apply_lra_code`).

  Raises:
    ValueError: for a variant the task does not have, or an ``authors`` (``lra_code``)
      variant for an attention outside SimpleTRON's variants (the LRA baselines).
  """
  if variant in (None, ""):
    return config
  known = task_variants(config.task)
  if variant not in known:
    raise ValueError(f"unknown config variant {variant!r} for task {config.task!r}; "
                     f"known: {known}")
  if variant in AUTHORS_VARIANTS:
    if not attentions.get(config.model.attention).simpletron:
      raise ValueError(f"config variant {variant!r} is the SimpleTRON authors' function: "
                       f"attention must be one of {attentions.simpletron_names()}, not "
                       f"{config.model.attention!r}")
    size = AUTHORS_VARIANTS[variant]
    apply_variant(config, size)
    _authors(config, paper_size=size is None)
    return config
  if variant in LRA_CODE_VARIANTS:
    if config.model.attention not in attentions.lra_baselines():
      raise ValueError(f"config variant {variant!r} is LRA's code: attention must be one of "
                       f"{list(attentions.lra_baselines())}, not {config.model.attention!r}")
    apply_variant(config, LRA_CODE_VARIANTS[variant])
    apply_lra_code(config)
    return config
  if variant in SPT_VARIANTS:
    from simpletron_jax.train import pretraining  # pylint: disable=import-outside-toplevel
    size, objective = SPT_VARIANTS[variant]
    apply_variant(config, size)
    config.pretrain = pretraining.default_config(objective)
    if size is None:   # the paper size: the SPT code's optimisation for the task and stage
      pretraining.apply_paper_recipe(config, "ft" if objective == "none" else "spt")
    return config
  _apply_task_variant(config, recipes.get(config.task).variants[variant])
  return config


def set_pooling_options(config: ml_collections.ConfigDict) -> None:
  """The attention options that follow the pooling; call it again after changing
  ``model.classifier_pool`` or ``model.lra_dual_no_cls`` in code (a command-line change of the
  pooling keeps the built values; a length that no longer fits is refused naming
  ``model.attention_kwargs.max_length``).

  * ``max_length`` of the attentions that size a weight or a pattern by the length
    (``AttentionRecipe.follows_max_length``; BigBird lays its pattern out on LRA's padded
    length):
    a reference to ``model.max_length``, plus 1 when a CLS token is prepended (CLS pooling,
    not the dual encoder of ``model.lra_dual_no_cls``), so the weights have LRA's shapes;
  * the option named by ``AttentionRecipe.cls_option`` (Sparse's ``global_first``): whether
    the pooling is CLS (``sparse_transformer.py``'s ``use_cls_token``: the first position is
    global; in LRA's dual encoder that is the first real token).
  """
  model = config.model
  cls = model.classifier_pool == "CLS"
  with_cls = cls and not (tasks.get(config.task).dual and model.get("lra_dual_no_cls", False))
  attention = attentions.get(model.attention)
  if attention.follows_max_length:
    model.attention_kwargs.max_length = model.get_ref("max_length") + int(with_cls)
  if attention.cls_option is not None:
    model.attention_kwargs[attention.cls_option] = cls


def apply_lra_model_bugs(config: ml_collections.ConfigDict) -> None:
  """The model options of LRA's bugs for ``config.model.attention`` on ``config.task``:
  its ``AttentionRecipe.lra_bug_options`` (the attention_kwargs under which our module computes
  what LRA's module computed, each checked against LRA's logits by
  tests/test_lra_golden.py; LRA's design choices need none: they are the defaults), MEAN
  pooling over the pads (``model.lra_mean_over_pads``), CLS
  taking the first token's padding mask (``model.lra_cls_mask``), and on retrieval the dual
  encoder without CLS (``model.lra_dual_no_cls``). The data are not touched (see
  :func:`apply_lra_code`)."""
  model = config.model
  for key, value in attentions.get(model.attention).lra_bug_options.items():
    model.attention_kwargs[key] = value
  model.lra_mean_over_pads = model.classifier_pool == "MEAN"
  model.lra_cls_mask = True
  if tasks.get(config.task).dual:
    model.lra_dual_no_cls = True
  set_pooling_options(config)


def apply_lra_code(config: ml_collections.ConfigDict) -> None:
  """The ``:lra_code`` variant: what LRA's code computed, bugs included, to reproduce a
  published LRA number and measure what each fix is worth (docs/lra_parity.md).

  :func:`apply_lra_model_bugs`, plus LRA's data handling: every batch padded to
  ``max_length`` (``data.bucket=0``, which the bugs that let pads in depend on); black pixels
  are padding on image, Pathfinder and Path-X (``data.lra_pixel_mask``); text validates on the
  test split (``data.val_fraction=0``); CIFAR-10's ``train[:90%]`` / ``train[90%:]``
  (``data.lra_split``; LRA's members with a tfds source, sizes only with the npz); Pathfinder's
  and Path-X's tfds members (``data.split_hash="lra"``); the last partial val/test batch
  dropped on image, Pathfinder, Path-X and retrieval (``data.drop_last_eval_batch``). Left as
  it is: the reporting protocol (``results.json`` reports both).
  """
  apply_lra_model_bugs(config)
  config.data.bucket = 0
  if "lra_pixel_mask" in config.data:
    config.data.lra_pixel_mask = True
  _set_all(config, recipes.get(config.task).lra_code)
  if "lra_split" in config.data:
    config.data.lra_split = True
  if "split_hash" in config.data:
    config.data.split_hash = "lra"
  if "drop_last_eval_batch" in config.data:
    config.data.drop_last_eval_batch = True


def make_config(task: str, attention: str, variant: str | None = None,
                **attention_kwargs) -> ml_collections.ConfigDict:
  """The config of ``attention`` on ``task``.

  Args:
    task: a registered task (``simpletron_jax.data.tasks.names()``).
    attention: a registered attention name (``simpletron_jax.model.attention.names()``).
    variant: ``None`` (the published size) or a name in ``task_variants(task)``.
    **attention_kwargs: fixed options of this config's attention, stored in
      ``model.attention_kwargs``.

  Returns:
    A ConfigDict. For the attentions whose ``AttentionRecipe.follows_max_length``,
    ``model.attention_kwargs.max_length`` is a reference to ``model.max_length + 1`` (CLS),
    so it follows command-line overrides of ``model.max_length``.

  Raises:
    ValueError: for an unknown task (naming the config field ``task`` and the known ones) or
      variant.
  """
  spec = tasks.get(task)
  config = _common(spec)
  _set_all(config, recipes.get(task).model_options, "model.")   # the published config's
  config.model.attention = attention
  if attentions.get(attention).simpletron:
    apply_simpletron_paper(config)
  _lra_variant_settings(config)
  for key, value in attention_kwargs.items():
    config.model.attention_kwargs[key] = value
  apply_variant(config, variant)
  set_pooling_options(config)
  if not attention_registry.get(attention).output_projection:   # heads side by side: the output
    config.model.qkv_dim = config.model.emb_dim
  add_attention_defaults(config)
  return config


def add_attention_defaults(config: ml_collections.ConfigDict) -> None:
  """Stores every option of ``model.attention`` not set yet in ``model.attention_kwargs``,
  at its module default (``AttentionSpec.options``), so that
  ``--config.model.attention_kwargs.<option>=...`` works for each option the variant has
  (ml_collections overrides only existing fields). The values equal the defaults, so the
  model is unchanged; set options and references (``max_length``) are kept."""
  kwargs = config.model.attention_kwargs
  for key, value in attention_registry.get(config.model.attention).options().items():
    if key not in kwargs:
      kwargs[key] = value
