"""Config builder for every (task, attention) pair: LRA's settings, SimpleTRON's where it has them.

Each file ``configs/<task>/<model>.py`` is one call to :func:`make_config`. The settings come
as docs/configs.md gives them:

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

TASKS = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")
SIMPLE_NAMES = ("simple", "simple_res", "simple_resl")
# Attentions that size a parameter by the sequence length (CLS included).
LENGTH_SIZED = ("aft_full", "aft_local", "linformer", "sinkhorn", "synthesizer",
                "synthesizer_random")
VARIANTS = {task: ("tiny",) for task in TASKS}
VARIANTS["listops"] = ("tiny", "tiny_lra")
# The SimpleTRON authors' function (``_authors``), for simple* on the paper's three tasks.
AUTHORS_VARIANTS = {"authors": None, "tiny_authors": "tiny"}  # -> the size variant used
AUTHORS_TASKS = ("listops", "text", "retrieval")
VARIANTS.update({task: VARIANTS[task] + tuple(AUTHORS_VARIANTS) for task in AUTHORS_TASKS})
# The function LRA's code computed, bugs included (:func:`apply_lra_code`), for the LRA
# baselines (:data:`LRA_MODEL_TYPES`) on every task.
LRA_CODE_VARIANTS = {"lra_code": None, "tiny_lra_code": "tiny"}  # -> the size variant used
VARIANTS.update({task: VARIANTS[task] + tuple(LRA_CODE_VARIANTS) for task in TASKS})
# Self-pretraining (Amos et al., 2024; simpletron_jax/pretraining.py): the pretraining stage
# (masked-token denoising on the task's training split) and the fine-tuning stage (the
# classifier with the [MASK] row reserved, run with --config.init_from=<pretraining run>),
# at the published size or ``tiny``. Not for retrieval (two documents; not supported yet).
SPT_VARIANTS = {"spt": (None, "mlm"), "tiny_spt": ("tiny", "mlm"),
                "spt_ft": (None, "none"), "tiny_spt_ft": ("tiny", "none")}
SPT_TASKS = ("listops", "text", "image", "pathfinder", "pathx")
VARIANTS.update({task: VARIANTS[task] + tuple(SPT_VARIANTS) for task in SPT_TASKS})
# AG News (SimpleTRON section 5.3; not an LRA task, so not in TASKS): configs/agnews/.
VARIANTS["agnews"] = ("tiny", "from_bert", "tiny_from_bert")


def variants(task: str, attention: str) -> tuple[str, ...]:
  """The ``:variant`` suffixes valid for ``attention`` on ``task`` (the ``AUTHORS_VARIANTS``
  only for :data:`SIMPLE_NAMES`, the ``LRA_CODE_VARIANTS`` only for the LRA baselines of
  :data:`LRA_MODEL_TYPES`)."""
  skip = set()
  if attention not in SIMPLE_NAMES:
    skip |= set(AUTHORS_VARIANTS)
  if attention not in LRA_MODEL_TYPES:
    skip |= set(LRA_CODE_VARIANTS)
  return tuple(v for v in VARIANTS[task] if v not in skip)


def _common(task: str) -> ml_collections.ConfigDict:
  """Fields every task shares; the task functions below overwrite them."""
  config = ml_collections.ConfigDict()
  config.task = task
  config.seed = 0

  config.batch_size = 32            # examples per optimizer step (global)
  config.grad_accum_steps = 1       # micro-steps per optimizer step
  config.eval_batch_size = 0        # 0: the micro-batch size
  config.num_train_steps = 5000     # optimizer steps
  config.num_eval_steps = -1        # batches per validation; -1: the whole split
  config.num_test_steps = -1        # batches of the final test; -1: the whole split
  config.eval_frequency = 50        # steps between validations
  config.checkpoint_every = 200     # steps between checkpoints
  config.max_to_keep = 2
  config.log_every = 10             # steps between train-metric records
  config.max_train_minutes = 0.0    # wall-clock budget per invocation; 0: none
  # How the run is executed and reported, not what it computes (run_record.RESUME_ALLOWED_FIELDS).
  config.parallelism = "pmap"       # "pmap" (LRA's) or "jit" (jax.jit over a device Mesh)
  config.async_checkpoints = False  # orbax saves in a background thread (docs/faults.md)
  config.wandb = ml_collections.ConfigDict()
  config.wandb.project = ""         # "": no Weights & Biases logging
  config.wandb.entity = ""          # "": the W&B account's default
  config.wandb.mode = ""            # "": W&B's WANDB_MODE (online if unset); "online"; "offline"

  # Weight surgery (simpletron_jax/transfer.py, lora.py); the papers' experiments.
  config.init_from = ""             # a train.py workdir: start from its best checkpoint's params
  config.init_include = ()          # regexes of parameter paths to copy; empty: every match
  config.freeze = ()                # regexes of parameter paths left untrained
  config.lora = ml_collections.ConfigDict()
  config.lora.rank = 0              # 0: no LoRA; else adapters of this rank, base frozen
  config.lora.alpha = 0.0           # scale alpha / rank; 0: alpha = rank
  config.lora.targets = ("attention/(query|key|value|out)/kernel$",)

  config.learning_rate = 0.05
  config.factors = "constant * linear_warmup * rsqrt_decay"
  config.warmup = 1000              # steps
  config.weight_decay = 0.1
  config.grad_clip_norm = 0.0       # global-norm clipping; 0: none
  config.adam_b1 = 0.9
  config.adam_b2 = 0.98
  config.adam_eps = 1e-9

  config.data = ml_collections.ConfigDict()
  config.data.data_dir = ml_collections.config_dict.placeholder(str)
  config.data.cache_dir = ml_collections.config_dict.placeholder(str)
  # The data seed follows config.seed until it is set itself: a reference of its own that
  # points at seed's, not seed's reference, which would make --config.data.seed=1 set
  # config.seed too (a ConfigDict field holding a reference passes a new value to it).
  config.data.seed = ml_collections.FieldReference(config.get_ref("seed"), field_type=int)
  config.data.bucket = 128          # pad each batch to a multiple of this; 0: max_length
  config.data.group_by_length = False  # length-grouped train batches (changes LRA's batches)
  config.data.group_pool_batches = 50  # batches per length-sorted pool when grouping

  config.model = ml_collections.ConfigDict()
  config.model.attention = "softmax"
  config.model.attention_kwargs = ml_collections.ConfigDict()
  config.model.attention_per_layer = ()  # one name per block; empty: model.attention in all
  config.model.emb_dim = 512
  config.model.num_heads = 8
  config.model.qkv_dim = 512
  config.model.mlp_dim = 1024
  config.model.num_layers = 4
  config.model.max_length = 2000    # tokens, CLS excluded
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


def _model(config, emb_dim, num_heads, num_layers, qkv_dim, mlp_dim):
  m = config.model
  m.emb_dim, m.num_heads, m.num_layers, m.qkv_dim, m.mlp_dim = (
      emb_dim, num_heads, num_layers, qkv_dim, mlp_dim)


def _listops(config):
  """LRA ``listops/configs/base_listops_config.py``: batch 32, lr 0.05 rsqrt, warmup 1000,
  5000 steps, 4 x 512 model, max_length 2000; data from the seeded generator."""
  data = config.data
  data.task_name = "basic"          # files are {task_name}_{train,val,test}.tsv
  data.num_train = 96000
  data.num_val = 2000
  data.num_test = 2000
  data.min_tokens = 500             # the generator keeps min_tokens < length < max_tokens
  data.max_tokens = 2000
  data.max_depth = 10
  data.max_args = 10


def _text(config):
  """LRA ``text_classification/configs/base_tc_config.py``: IMDB bytes, 20000 steps,
  warmup 8000, 4 x 256 model, validation every 100 steps. max_length 4000 as in the LRA
  paper and SimpleTRON; :func:`_lra_variant_settings` sets LRA's code value, 1000, for every
  attention but the simple ones."""
  config.num_train_steps = 20000
  config.warmup = 8000
  config.eval_frequency = 100
  config.checkpoint_every = 500
  config.data.tfds_data_dir = ml_collections.config_dict.placeholder(str)
  # IMDB has no validation split: hold out a seeded 10% of train, so the best-validation
  # checkpoint is not chosen on test. 0: LRA's code, which validates on the test split.
  config.data.val_fraction = 0.1
  _model(config, 256, 4, 4, 256, 1024)
  config.model.max_length = 4000


def _retrieval(config):
  """LRA ``matching/configs/base_match_config.py``: AAN pairs, 5000 steps, warmup 8000,
  4 x 128 model, 4000 bytes per document; ``data.data_dir`` must name the folder with
  ``new_aan_pairs.{train,eval,test}.tsv``."""
  config.num_train_steps = 5000
  config.warmup = 8000
  config.eval_frequency = 100
  config.checkpoint_every = 500
  config.data.unescape = False      # True decodes the b'...' literals of the TSV (not LRA's)
  config.data.drop_last_eval_batch = False  # True: LRA drops the last partial val/test batch
  _model(config, 128, 4, 4, 128, 512)
  config.model.max_length = 4000
  # LRA's code: classifier_head_dual(interaction=None), i.e. [u, v]; "nli" is the LRA
  # paper's [u, v, u * v, u - v].
  config.model.interaction = "concat"
  # True: LRA's TransformerDualEncoder, whose encoders have no CLS token, so "CLS" pooling
  # reads the first real token (a bug; docs/lra_parity.md).
  config.model.lra_dual_no_cls = False


def _image_recipe(config, batch_size, train_examples, epochs, learning_rate):
  """LRA's image recipe: cosine decay over ``epochs`` epochs after a one-epoch warmup,
  validation once an epoch, no weight decay."""
  steps_per_epoch = train_examples // batch_size
  config.batch_size = batch_size
  config.learning_rate = learning_rate
  config.factors = "constant * linear_warmup * cosine_decay"
  config.warmup = steps_per_epoch
  config.num_train_steps = steps_per_epoch * epochs
  config.eval_frequency = steps_per_epoch
  config.checkpoint_every = steps_per_epoch
  config.weight_decay = 0.0
  config.data.bucket = 0            # every image is a full sequence


def _image(config):
  """LRA ``image/configs/cifar10/{base_cifar10_config,transformer_base}.py``: CIFAR-10
  grayscale, batch 256, 200 epochs of 45,000 images, lr 5e-4 cosine, 1 x 128 model with
  8 heads, qkv 64, mlp 128, dropout 0.3 / 0.2, CLS pooling, learned positions."""
  _image_recipe(config, 256, 45000, 200, 5e-4)
  config.data.tfds_data_dir = ml_collections.config_dict.placeholder(str)
  config.data.val_fraction = 0.1
  _model(config, 128, 8, 1, 64, 128)
  config.model.max_length = 1024
  config.model.dropout_rate = 0.3
  config.model.attention_dropout_rate = 0.2
  config.model.learn_pos_emb = True
  config.data.lra_pixel_mask = False  # True: LRA's mask token > 0 (black pixels are padding)
  # True: LRA's train[:90%] / train[90%:] in source order (exact with tfds cifar10; with the
  # npz copy LRA's sizes only); False: a seeded 90/10 draw.
  config.data.lra_split = False
  # True: LRA's batch(drop_remainder=True) on val/test (10,000 test images -> 9,984 at 256).
  config.data.drop_last_eval_batch = False


def _pathfinder_data(config, resolution, num_images):
  data = config.data
  data.resolution = resolution      # pixels per side
  data.level = "hard"               # easy | intermediate | hard (contour length 6 / 9 / 14)
  data.num_images = num_images      # images to generate when data_dir is unset
  # dashed: LRA's images (the algorithm of drewlinsley/pathfinder, contours of separate
  # paddles) | solid: connected paths, whose label a connected-component labelling reads off
  data.generator = "dashed"
  data.split_fractions = (0.8, 0.1, 0.1)
  data.lra_pixel_mask = False       # True: LRA's mask token > 0 (black pixels are padding)
  data.split_hash = "blake2b"       # blake2b (seeded) | lra: LRA's tfds members (MD5 of keys)
  data.drop_last_eval_batch = False  # True: LRA drops the last partial val/test batch


def _pathfinder(config):
  """LRA ``image/configs/pathfinder32/{base_pathfinder32_config,transformer_base}.py``:
  batch 512, 200 epochs of 160,000 images, lr 1e-3 cosine, 4 x 32 model with 4 heads, qkv 16,
  mlp 32, dropout 0.2 / 0.1, MEAN pooling, sinusoidal positions."""
  _image_recipe(config, 512, 160000, 200, 1e-3)
  _pathfinder_data(config, 32, 200000)
  _model(config, 32, 4, 4, 16, 32)
  config.model.max_length = 1024
  config.model.dropout_rate = 0.2
  config.model.classifier_pool = "MEAN"


def _pathx(config):
  """LRA ``image/configs/pathfinder128/base_pathfinder128_config.py`` (Path-X): batch 64,
  200 epochs of 160,000 images, lr 1e-3 cosine, gradient clipping 1.0, 1 x 32 model with
  2 heads, qkv 16, mlp 32, MEAN pooling, learned positions, 16,384 tokens."""
  _image_recipe(config, 64, 160000, 200, 1e-3)
  config.grad_clip_norm = 1.0
  _pathfinder_data(config, 128, 200000)
  _model(config, 32, 2, 1, 16, 32)
  config.model.max_length = 16384
  config.model.classifier_pool = "MEAN"
  config.model.learn_pos_emb = True


# --- AG News with BERT's encoder: SimpleTRON section 5.3, Table 2 (docs/bert.md) -------------
AGNEWS_FROM_BERT = ("set --config.init_from to the folder written by python -m "
                    "simpletron_jax.bert_import BERT_DIR OUT_DIR (docs/bert.md)")


def _agnews(config):
  """SimpleTRON section 5.3: AG News with a BERT-base-sized encoder, from scratch (Table 2)
  or from BERT's weights (``:from_bert``).

  From the paper: 12 blocks, width 768, 12 heads, MLP 3072, CLS pooling, learned positions,
  GELU. Not in the paper, each value from the SimpleTRON authors' AG News code (``ag/``,
  docs/bert.md) where it has one, else BERT's (Devlin et al., 2019):

  * BERT's encoder (the authors' too): post-LN blocks, BERT's embeddings with 512 positions,
    the pooler (dense + tanh on ``[CLS]``), one Dense classifier without dropout before it,
    biases on q/k/v/out, exact GELU, no dropout inside the MLP; LayerNorm epsilon 1e-12
    (BERT's; the authors' code has 1e-6) and 2 token types (BERT's; the authors dropped them);
  * the authors': dropout 0.2 (here on the attention weights of softmax too, a model they
    logged no run of), AdamW lr 5e-5, betas (0.9, 0.999), eps 1e-8, weight decay 1e-3, batch
    32 (theirs: 8 x 4 accumulated), about 10 epochs with a 10% warmup (here 35,625 steps =
    10 epochs of the 114,000 training articles);
  * this project's: ``max_length`` 128 WordPiece tokens (the authors padded to 512, with no
    truncation), a seeded 5% of train for validation (the authors: the last 30%), cosine decay
    after the warmup (the authors: linear to lr/32; the project's schedules have no linear
    decay), no layer-wise lr decay (the authors: 0.9 per layer), validation every 1,000 steps.

  ``data.vocab_path`` must name a BERT checkpoint folder (or its ``vocab.txt``): the paper
  tokenized with ``bert-base-cased``'s.
  """
  config.num_train_steps = 35625
  config.warmup = 3562
  config.eval_frequency = 1000
  config.checkpoint_every = 1000
  config.learning_rate = 5e-5
  config.factors = "constant * linear_warmup * cosine_decay"
  config.weight_decay = 1e-3
  config.adam_b2 = 0.999
  config.adam_eps = 1e-8
  data = config.data
  data.tfds_data_dir = ml_collections.config_dict.placeholder(str)  # tfds ag_news_subset
  data.vocab_path = ml_collections.config_dict.placeholder(str)     # BERT folder or vocab.txt
  data.lowercase = ml_collections.config_dict.placeholder(bool)     # None: as the checkpoint
  data.val_fraction = 0.05
  data.bucket = 32
  _model(config, 768, 12, 12, 768, 3072)
  model = config.model
  model.max_length = 128            # WordPiece tokens, [CLS] and [SEP] included
  model.max_positions = 512         # BERT's position table
  model.dropout_rate = 0.2
  model.attention_dropout_rate = 0.2
  model.learn_pos_emb = True
  model.classifier_pool = "CLS"     # BERT's [CLS] token, position 0
  model.head = "dense"
  model.embedding_type = "bert"
  model.type_vocab_size = 2
  model.block_norm = "post"
  model.pooler = True
  model.final_layer_norm = False
  model.layer_norm_epsilon = 1e-12
  model.mlp_hidden_dropout = False
  model.attention_bias = True
  model.mlp_activation = "gelu_exact"


def _agnews_variant(config, variant: str) -> ml_collections.ConfigDict:
  """AG News variants: ``tiny`` (a CPU smoke test: 2 blocks, width 64, 2 heads, MLP 128,
  64 tokens, batch 32, lr 1e-3, 500 steps with a 50-step warmup, validation every 250 steps
  on 16 batches); ``from_bert`` and ``tiny_from_bert`` (the same, started from BERT's
  weights: ``init_from`` must be set to a folder written by ``simpletron_jax.bert_import``,
  and until it is the run stops, naming it)."""
  if variant in ("tiny", "tiny_from_bert"):
    _tiny_model(config)
    config.model.max_length = 64
    config.model.max_positions = 64
    config.batch_size = 32
    config.learning_rate = 1e-3
    _tiny_schedule(config, 500, 50, 250, eval_batches=16, test_batches=-1)
  if variant.endswith("from_bert"):
    config.init_from = AGNEWS_FROM_BERT
  return config


_TASK_SETTINGS = {"listops": _listops, "text": _text, "retrieval": _retrieval,
                  "image": _image, "pathfinder": _pathfinder, "pathx": _pathx,
                  "agnews": _agnews}


def apply_simpletron_paper(config: ml_collections.ConfigDict) -> None:
  """SimpleTRON appendix A (ListOps, text, matching): AdamW (0.9, 0.999), learned
  positions, and per task:

  * ListOps: 6 blocks, 8 heads, 512 / 512 / 2048, lr 0.005, warmup 1000, 15000 steps.
  * Text: 4 blocks, 4 heads, 256 / 256 / 1024, lr 0.05, warmup 8000, 20000 steps, L 4000.
  * Matching: 4 blocks, 4 heads, 128 / 128 / 512, lr 0.05, warmup 8000, 15000 steps, L 4000.

  Other tasks are left unchanged (the paper has no settings for them).
  """
  if config.task not in ("listops", "text", "retrieval"):
    return
  config.adam_b2 = 0.999
  config.adam_eps = 1e-8
  config.model.learn_pos_emb = True
  if config.task == "listops":
    config.learning_rate = 0.005
    config.num_train_steps = 15000
    config.model.num_layers = 6
    config.model.mlp_dim = 2048
  elif config.task == "retrieval":
    config.num_train_steps = 15000


# --- LRA's per-variant settings (read from lra_benchmarks/*/configs/ at commit cd31e5c) -----
# The registry name of each LRA baseline -> LRA's ``config.model_type``.
LRA_MODEL_TYPES = {"softmax": "transformer", "linear": "linear_transformer",
                   "performer": "performer", "linformer": "linformer", "local": "local",
                   "sparse": "sparse_transformer", "longformer": "longformer",
                   "bigbird": "bigbird", "sinkhorn": "sinkhorn", "synthesizer": "synthesizer",
                   "synthesizer_random": "synthesizer", "reformer": "reformer"}

# image/configs/cifar10/<model_type>_base.py over base_cifar10_config.py (emb 32, 1 head,
# 1 layer, qkv 32, mlp 64, dropout 0.3, CLS). model fields, then attention_kwargs.
_LRA_CIFAR10 = {
    "transformer": ({"num_layers": 1, "num_heads": 8, "emb_dim": 128, "qkv_dim": 64,
                     "mlp_dim": 128}, {}),
    # bigbird_base.py sets ``config.model.num_head = 4``, a misspelt field that LRA's image
    # train.py passes to the model, which raises (TypeError), so LRA's image BigBird never ran
    # from that config; these are its sizes with the misspelt field dropped (1 head).
    "bigbird": ({"num_layers": 1, "num_heads": 1, "emb_dim": 128, "qkv_dim": 64,
                 "mlp_dim": 128}, {"block_size": 64}),
    "linear_transformer": ({"num_layers": 1, "num_heads": 8, "emb_dim": 128, "qkv_dim": 64,
                            "mlp_dim": 128}, {}),
    "linformer": ({"num_layers": 1, "num_heads": 8, "emb_dim": 128, "qkv_dim": 64,
                   "mlp_dim": 128}, {}),
    "local": ({"num_layers": 1, "num_heads": 2, "emb_dim": 128, "qkv_dim": 64, "mlp_dim": 128,
               "classifier_pool": "MEAN"}, {"block_size": 64}),
    "longformer": ({"num_layers": 4, "num_heads": 4, "emb_dim": 128, "qkv_dim": 64,
                    "mlp_dim": 128, "classifier_pool": "MEAN"}, {}),
    "performer": ({"num_layers": 1, "num_heads": 8, "emb_dim": 128, "qkv_dim": 64,
                   "mlp_dim": 128}, {}),
    "reformer": ({"num_layers": 4, "num_heads": 8, "emb_dim": 64, "qkv_dim": 32,
                  "mlp_dim": 64}, {}),
    # sinkhorn_base.py keeps the base sizes, sets dropout 0.1 and weight_decay 0.7.
    "sinkhorn": ({"num_layers": 1, "num_heads": 1, "emb_dim": 32, "qkv_dim": 32,
                  "mlp_dim": 64, "dropout_rate": 0.1}, {"block_size": 64}),
    "sparse_transformer": ({"num_layers": 1, "num_heads": 8, "emb_dim": 128, "qkv_dim": 64,
                            "mlp_dim": 128}, {}),
    "synthesizer": ({"num_layers": 1, "num_heads": 8, "emb_dim": 128, "qkv_dim": 64,
                     "mlp_dim": 128}, {}),
}

# image/configs/pathfinder32/<model_type>_base.py over base_pathfinder32_config.py (emb 32,
# 2 heads, 1 layer, qkv 16, mlp 32, dropout 0.1, MEAN, sinusoidal positions).
_LRA_PATHFINDER32 = {
    "transformer": ({"num_layers": 4, "num_heads": 4, "emb_dim": 32, "qkv_dim": 16,
                     "mlp_dim": 32, "dropout_rate": 0.2}, {}),
    "bigbird": ({"num_layers": 4, "num_heads": 2, "emb_dim": 64, "qkv_dim": 32, "mlp_dim": 64,
                 "dropout_rate": 0.2}, {"block_size": 64}),
    "linear_transformer": ({"num_layers": 1, "num_heads": 2, "emb_dim": 128, "qkv_dim": 64,
                            "mlp_dim": 128, "dropout_rate": 0.2}, {}),
    "linformer": ({"num_layers": 1, "num_heads": 2, "emb_dim": 32, "qkv_dim": 16,
                   "mlp_dim": 32, "dropout_rate": 0.2}, {}),
    "local": ({"num_layers": 2, "num_heads": 4, "emb_dim": 64, "qkv_dim": 32, "mlp_dim": 64,
               "dropout_rate": 0.1}, {"block_size": 64}),
    "longformer": ({"num_layers": 2, "num_heads": 2, "emb_dim": 32, "qkv_dim": 16,
                    "mlp_dim": 32, "dropout_rate": 0.1}, {}),
    "performer": ({"num_layers": 4, "num_heads": 8, "emb_dim": 32, "qkv_dim": 16,
                   "mlp_dim": 32, "dropout_rate": 0.2}, {}),
    "reformer": ({"num_layers": 2, "num_heads": 8, "emb_dim": 64, "qkv_dim": 32,
                  "mlp_dim": 64, "dropout_rate": 0.2}, {}),
    "sinkhorn": ({"num_layers": 2, "num_heads": 4, "emb_dim": 32, "qkv_dim": 16,
                  "mlp_dim": 64, "dropout_rate": 0.2}, {"block_size": 64}),
    "sparse_transformer": ({"num_layers": 1, "num_heads": 8, "emb_dim": 32, "qkv_dim": 16,
                            "mlp_dim": 32, "dropout_rate": 0.2}, {}),
    "synthesizer": ({"num_layers": 2, "num_heads": 4, "emb_dim": 64, "qkv_dim": 32,
                     "mlp_dim": 64, "dropout_rate": 0.2}, {}),
}

_LRA_SIZED_TASKS = {"image": _LRA_CIFAR10, "pathfinder": _LRA_PATHFINDER32}


def _lra_attention_kwargs(config, attention: str) -> dict:
  """The attention options LRA's code ran for ``attention`` on ``config.task``.

  * Performer: ``listops/configs/performer_base.py`` asks for FAVOR+ softmax with
    ``nb_features=2`` (``ortho_scaling=0``, redrawn every call: ``redraw_features=True``,
    seeded by the sum of the queries: option ``attention_kwargs.lra_bugs``);
    every other task runs the default of ``models/performer/performer.py``,
    ``make_fast_generalized_attention``: deterministic ``relu(x) + 0.001``.
  * Linformer: ``low_rank_features=16`` (``models/linformer/linformer_attention.py``
    default; the text config's 32 is a top-level field its train.py never passes).
  * Synthesizer: ``models/synthesizer/synthesizer.py`` defaults to random logits plus the dot
    product (``synthesizer_mode='random'``, ``ignore_dot_product=False``); the text config's
    factorized settings are top-level fields, never passed.
  * Reformer: ``models/reformer/reformer_attention.py``'s ``n_buckets=10`` chunks per round
    and no output projection are the module's defaults; ``lra_bugs=False`` is present so
    that ``--config.model.attention_kwargs.lra_bugs=True`` can switch on LRA's bugs. Its
    ``qkv_dim`` is ``emb_dim`` (set in :func:`make_config`): LRA's ``ReformerAttention``
    takes ``qkv_features`` from the input width, whatever ``qkv_dim`` says.

  * BigBird: ``max_length`` is ``model.max_length`` (+ 1 with CLS), the length LRA pads every
    batch to, so the block pattern (global last block, random blocks) is LRA's whatever
    the batch's bucket; ``lra_bugs=False`` is present for the command line.

  Linear, Performer and Linformer also get ``lra_masking=False`` (the correct function),
  present so that ``--config.model.attention_kwargs.lra_masking=True`` can switch on LRA's
  missing padding mask.
  """
  if attention == "performer":
    if config.task == "listops":
      return {"kernel": "softmax", "num_features": 2, "redraw": True, "lra_masking": False}
    return {"kernel": "relu_deterministic", "lra_masking": False}
  if attention == "linformer":
    return {"k": 16, "lra_masking": False}
  if attention == "linear":
    return {"lra_masking": False}
  if attention == "synthesizer_random":
    return {"dot_product": True}
  if attention == "local":
    return {"lra_bugs": False}
  if attention in ("sparse", "bigbird"):   # + the pooling's options, set_pooling_options
    return {"lra_bugs": False}
  if attention == "reformer":
    return {"lra_bugs": False}
  return {}


def _lra_variant_settings(config) -> None:
  """LRA's per-variant settings for the LRA baselines (:data:`LRA_MODEL_TYPES`).

  * Attention options: :func:`_lra_attention_kwargs`.
  * Text: ``max_length`` 1000 (``text_classification/configs/base_tc_config.py``) for
    every attention but :data:`SIMPLE_NAMES`, which keep SimpleTRON's 4000.
  * Image and Pathfinder-32: each baseline's own sizes, dropout, pooling and block size
    (``image/configs/{cifar10,pathfinder32}/<model_type>_base.py``); CIFAR-10 Sinkhorn
    also weight decay 0.7. Path-X has only a Transformer config in LRA: every variant uses
    its base sizes.
  """
  attention = config.model.attention
  if config.task == "text" and attention not in SIMPLE_NAMES:
    config.model.max_length = 1000
  model_type = LRA_MODEL_TYPES.get(attention)
  if model_type is None:
    return
  table = _LRA_SIZED_TASKS.get(config.task, {})
  if model_type in table:
    fields, kwargs = table[model_type]
    for key, value in fields.items():
      config.model[key] = value
    for key, value in kwargs.items():
      config.model.attention_kwargs[key] = value
  if config.task == "image" and model_type == "sinkhorn":
    config.weight_decay = 0.7
  if model_type == "sinkhorn" and config.task != "retrieval":
    # SinkhornTransformerEncoder: no CLS, MEAN pooling, one Dense head on emb_dim. For CLS it
    # raises "Pooling method not supported yet", so LRA's text and image configs never ran;
    # its dual encoder (retrieval) pools CLS through classifier_head_dual like the others.
    config.model.classifier_pool = "MEAN"
    config.model.head = "dense"
  for key, value in _lra_attention_kwargs(config, attention).items():
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
  if config.task == "retrieval":
    model.head_activation = "relu"
    model.final_layer_norm = False
    model.interaction = "concat"
    if paper_size:
      model.num_heads = 8


def _tiny_model(config):
  """The CPU size of the Nystromformer LRA setup: 2 layers, emb 64, 2 heads, qkv 64, mlp 128."""
  _model(config, 64, 2, 2, 64, 128)


def _tiny_schedule(config, steps, warmup, eval_every, eval_batches, test_batches):
  config.num_train_steps = steps
  config.warmup = warmup
  config.eval_frequency = eval_every
  config.checkpoint_every = eval_every
  config.num_eval_steps = eval_batches
  config.num_test_steps = test_batches


def apply_variant(config: ml_collections.ConfigDict, variant: str | None):
  """Applies a ``:variant`` suffix; every task has ``tiny``, a CPU run of minutes.

  * ListOps ``tiny``: the tiny model on generated ListOps of 20 < tokens < 200 (the range of
    the original ListOps, Nangia & Bowman 2018), max_length 200, lr 0.05 with warmup 1000,
    5000 steps, validation every 200 steps.
  * ListOps ``tiny_lra``: the same model on LRA-length ListOps (500 < tokens < 2000). On a
    CPU it stays at the majority class for the first thousands of steps.
  * Text ``tiny``: the tiny model on the first 512 bytes of each review, 500 steps (warmup
    100), validation every 250 steps on 512 test reviews; the final test reads a fixed random
    4,096 of the 25,000 test reviews.
  * Retrieval ``tiny``: the tiny model on 512 bytes per document, as text.
  * Image ``tiny``: 1 layer, emb 64, 2 heads, qkv 64, mlp 128, batch 32, lr 1e-3 cosine,
    500 steps (warmup 100), validation every 250 steps on 512 images, test on all 10,000.
  * Pathfinder ``tiny``: LRA's model cut to 1 layer and 2 heads (emb 32, qkv 16, mlp 32),
    so that its softmax has as many L x L scores per example as the image ``tiny`` model,
    on 10,000 generated images (8,000 train), batch 32, 500 steps (warmup 100), validation
    every 250 steps.
  * Path-X ``tiny``: LRA's Path-X model on 2,000 generated 128 x 128 images, batch 8,
    200 steps: a smoke test of 16,384-token training, not a result.
  * ``spt`` and ``tiny_spt`` (every task but retrieval): self-pretraining (Amos et al.,
    ICLR 2024), the paper size or ``tiny`` with ``config.pretrain`` (masked-token denoising
    at rate 0.5 on the training split; :mod:`simpletron_jax.pretraining`); ``spt_ft`` and
    ``tiny_spt_ft``: the classifier that fine-tunes from it (``--config.init_from=<spt
    run>``), with the [MASK] embedding row reserved so the embedding transfers. ``spt`` and
    ``spt_ft`` train with the SPT code's recipe for the task and stage
    (:func:`simpletron_jax.pretraining.apply_paper_recipe`: lr, weight decay, warmup then
    constant, batch, epochs, no dropout) on LRA's encoder; the ``tiny`` ones keep ``tiny``'s
    schedule.
  * ``authors`` and ``tiny_authors`` (ListOps, text, retrieval; ``simple``, ``simple_res``,
    ``simple_resl`` only): the paper size or ``tiny``, computing the SimpleTRON authors'
    function (:func:`_authors`), to compare with the published numbers.

  Raises:
    ValueError: for a variant the task does not have, or an ``authors`` variant for an
      attention outside :data:`SIMPLE_NAMES`.
  """
  if variant in (None, ""):
    return config
  if variant not in VARIANTS[config.task]:
    raise ValueError(f"unknown config variant {variant!r} for task {config.task!r}; "
                     f"known: {VARIANTS[config.task]}")
  if variant in AUTHORS_VARIANTS:
    if config.model.attention not in SIMPLE_NAMES:
      raise ValueError(f"config variant {variant!r} is the SimpleTRON authors' function: "
                       f"attention must be one of {SIMPLE_NAMES}, not "
                       f"{config.model.attention!r}")
    size = AUTHORS_VARIANTS[variant]
    apply_variant(config, size)
    _authors(config, paper_size=size is None)
    return config
  if variant in LRA_CODE_VARIANTS:
    if config.model.attention not in LRA_MODEL_TYPES:
      raise ValueError(f"config variant {variant!r} is LRA's code: attention must be one of "
                       f"{sorted(LRA_MODEL_TYPES)}, not {config.model.attention!r}")
    apply_variant(config, LRA_CODE_VARIANTS[variant])
    apply_lra_code(config)
    return config
  if variant in SPT_VARIANTS:
    from simpletron_jax import pretraining  # pylint: disable=import-outside-toplevel
    size, objective = SPT_VARIANTS[variant]
    apply_variant(config, size)
    config.pretrain = pretraining.default_config(objective)
    if size is None:   # the paper size: the SPT code's optimisation for the task and stage
      pretraining.apply_paper_recipe(config, "ft" if objective == "none" else "spt")
    return config
  if config.task == "agnews":
    return _agnews_variant(config, variant)
  if config.task == "listops":
    _tiny_model(config)
    config.learning_rate = 0.05
    _tiny_schedule(config, 5000, 1000, 200, eval_batches=-1, test_batches=-1)
    if variant == "tiny":
      config.data.min_tokens = 20
      config.data.max_tokens = 200
      config.model.max_length = 200
      config.data.bucket = 32
  elif config.task in ("text", "retrieval"):
    _tiny_model(config)
    config.learning_rate = 0.05
    config.model.max_length = 512
    _tiny_schedule(config, 500, 100, 250, eval_batches=16, test_batches=128)
  elif config.task == "image":
    _model(config, 64, 2, 1, 64, 128)
    config.batch_size = 32
    config.learning_rate = 1e-3
    _tiny_schedule(config, 500, 100, 250, eval_batches=16, test_batches=-1)
  elif config.task == "pathfinder":
    config.model.num_layers = 1
    config.model.num_heads = 2
    config.batch_size = 32
    config.data.num_images = 10000
    _tiny_schedule(config, 500, 100, 250, eval_batches=-1, test_batches=-1)
  elif config.task == "pathx":
    config.batch_size = 8
    config.data.num_images = 2000
    _tiny_schedule(config, 200, 50, 100, eval_batches=25, test_batches=25)
  return config


def set_pooling_options(config: ml_collections.ConfigDict) -> None:
  """The attention options that follow the pooling; call it again after changing
  ``model.classifier_pool`` or ``model.lra_dual_no_cls`` in code (a command-line change of the
  pooling keeps the built values; a length that no longer fits is refused naming
  ``model.attention_kwargs.max_length``).

  * ``max_length`` of the attentions that size a weight or a pattern by the length
    (:data:`LENGTH_SIZED`, and BigBird, which lays its pattern out on LRA's padded length):
    a reference to ``model.max_length``, plus 1 when a CLS token is prepended (CLS pooling,
    not the dual encoder of ``model.lra_dual_no_cls``), so the weights have LRA's shapes;
  * Sparse's ``global_first``: the first position is global under CLS pooling
    (``sparse_transformer.py``'s ``use_cls_token``; in LRA's dual encoder that is the first
    real token).
  """
  model = config.model
  cls = model.classifier_pool == "CLS"
  with_cls = cls and not (config.task == "retrieval" and model.get("lra_dual_no_cls", False))
  if model.attention in LENGTH_SIZED + ("bigbird",):
    model.attention_kwargs.max_length = model.get_ref("max_length") + int(with_cls)
  if model.attention == "sparse":
    model.attention_kwargs.global_first = cls


# LRA's bugs per attention (docs/lra_parity.md): the attention_kwargs under which our module
# computes what LRA's module computed. Each is checked against LRA's own logits by
# tests/test_lra_golden.py. LRA's design choices need no entry: they are the defaults.
LRA_BUG_KWARGS = {
    "softmax": {"lra_masking": True},       # query AND key mask: pad rows uniform
    "linear": {"lra_masking": True},        # no padding mask at all
    "performer": {"lra_masking": True, "lra_bugs": True},  # + features seeded from sum(q)
    "linformer": {"lra_masking": True},
    "local": {"lra_bugs": True},
    "sparse": {"lra_bugs": True},
    "longformer": {"lra_bugs": True},   # pad query rows uniform over every position
    "bigbird": {"lra_bugs": True},      # appended keys real, pad rows zero, no dropout
    "sinkhorn": {"lra_bugs": True},
    "synthesizer": {},                      # the dense form: LRA never ran it
    "synthesizer_random": {"lra_bugs": True},
    "reformer": {"lra_bugs": True},
}


def apply_lra_model_bugs(config: ml_collections.ConfigDict) -> None:
  """The model options of LRA's bugs for ``config.model.attention`` on ``config.task``:
  :data:`LRA_BUG_KWARGS`, MEAN pooling over the pads (``model.lra_mean_over_pads``), CLS
  taking the first token's padding mask (``model.lra_cls_mask``), and on retrieval the dual
  encoder without CLS (``model.lra_dual_no_cls``). The data are not touched (see
  :func:`apply_lra_code`)."""
  model = config.model
  for key, value in LRA_BUG_KWARGS.get(model.attention, {}).items():
    model.attention_kwargs[key] = value
  model.lra_mean_over_pads = model.classifier_pool == "MEAN"
  model.lra_cls_mask = True
  if config.task == "retrieval":
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
  if config.task == "text":
    config.data.val_fraction = 0.0
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
    task: one of :data:`TASKS`.
    attention: a registered attention name (``simpletron_jax.attention.names()``).
    variant: ``None`` (the published size) or a name in ``VARIANTS[task]``.
    **attention_kwargs: fixed options of this config's attention, stored in
      ``model.attention_kwargs``.

  Returns:
    A ConfigDict. For the attentions in :data:`LENGTH_SIZED`,
    ``model.attention_kwargs.max_length`` is a reference to ``model.max_length + 1`` (CLS),
    so it follows command-line overrides of ``model.max_length``.

  Raises:
    ValueError: for an unknown task or variant.
  """
  if task not in _TASK_SETTINGS:
    raise ValueError(f"unknown task {task!r}; known: {TASKS}")
  config = _common(task)
  _TASK_SETTINGS[task](config)
  config.model.attention = attention
  if attention in SIMPLE_NAMES:
    apply_simpletron_paper(config)
  _lra_variant_settings(config)
  if attention == "softmax":
    # "einsum" (LRA's), "xla" or "flash" (cuDNN; bfloat16, attention_dropout_rate=0).
    config.model.attention_kwargs.implementation = "einsum"
  for key, value in attention_kwargs.items():
    config.model.attention_kwargs[key] = value
  apply_variant(config, variant)
  set_pooling_options(config)
  if (attention in SIMPLE_NAMES and attention != "simple_resl") or attention == "reformer":
    config.model.qkv_dim = config.model.emb_dim   # no output projection
  add_attention_defaults(config)
  return config


def add_attention_defaults(config: ml_collections.ConfigDict) -> None:
  """Stores every option of ``model.attention`` not set yet in ``model.attention_kwargs``,
  at its module default (``AttentionSpec.options``), so that
  ``--config.model.attention_kwargs.<option>=...`` works for each option the variant has
  (ml_collections overrides only existing fields). The values equal the defaults, so the
  model is unchanged; set options and references (``max_length``) are kept."""
  from simpletron_jax import attention  # pylint: disable=import-outside-toplevel
  kwargs = config.model.attention_kwargs
  for key, value in attention.get(config.model.attention).options().items():
    if key not in kwargs:
      kwargs[key] = value
