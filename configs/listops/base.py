"""Shared ListOps settings: LRA's Transformer baseline (``listops/configs/base_listops_config.py``).

Model files call :func:`get_base_config`, set their attention and paper values,
then :func:`apply_variant` for a ``:variant`` suffix such as ``:tiny``.
"""

import ml_collections

VARIANTS = ("tiny", "tiny_short")


def get_base_config() -> ml_collections.ConfigDict:
  """LRA ListOps defaults: batch 32, lr 0.05 rsqrt, warmup 1000, 5000 steps, 4x512 model."""
  config = ml_collections.ConfigDict()
  config.task = "listops"
  config.seed = 0

  config.batch_size = 32            # examples per optimizer step (global)
  config.grad_accum_steps = 1       # micro-steps per optimizer step
  config.eval_batch_size = 0        # 0: the micro-batch size
  config.num_train_steps = 5000     # optimizer steps
  config.num_eval_steps = -1        # batches per evaluation; -1: the whole split
  config.eval_frequency = 50        # steps between validations (LRA)
  config.checkpoint_every = 200     # steps between checkpoints
  config.max_to_keep = 2
  config.log_every = 10             # steps between train-metric records
  config.max_train_minutes = 0.0    # wall-clock budget per invocation; 0: none

  config.learning_rate = 0.05
  config.factors = "constant * linear_warmup * rsqrt_decay"
  config.warmup = 1000              # steps
  config.weight_decay = 0.1
  config.adam_b1 = 0.9
  config.adam_b2 = 0.98
  config.adam_eps = 1e-9

  config.data = ml_collections.ConfigDict()
  config.data.data_dir = ml_collections.config_dict.placeholder(str)  # None: generate
  config.data.cache_dir = ml_collections.config_dict.placeholder(str)
  config.data.task_name = "basic"   # files are {task_name}_{train,val,test}.tsv
  config.data.seed = config.get_ref("seed")  # generator seed; follows config.seed
  config.data.num_train = 96000
  config.data.num_val = 2000
  config.data.num_test = 2000
  config.data.min_tokens = 500      # generator keeps min_tokens < length < max_tokens
  config.data.max_tokens = 2000
  config.data.max_depth = 10
  config.data.max_args = 10
  config.data.bucket = 128          # pad each batch to a multiple of this; 0: max_length

  config.model = ml_collections.ConfigDict()
  config.model.attention = "softmax"
  config.model.attention_kwargs = ml_collections.ConfigDict()
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
  config.model.dtype = "float32"
  return config


def apply_simpletron_paper(config: ml_collections.ConfigDict) -> None:
  """SimpleTRON appendix A, ListOps: 6 blocks, 8 heads, 512/512/2048, lr 0.005,
  warmup 1000, 15000 steps, AdamW (0.9, 0.999), wd 0.1, learned positions."""
  config.learning_rate = 0.005
  config.num_train_steps = 15000
  config.adam_b2 = 0.999
  config.adam_eps = 1e-8
  config.model.num_layers = 6
  config.model.mlp_dim = 2048
  config.model.learn_pos_emb = True


def apply_variant(config: ml_collections.ConfigDict, variant: str | None):
  """Applies a ``:variant`` suffix.

  * ``tiny``: a CPU-sized model (2 layers, emb 64, 2 heads, qkv 64, mlp 128,
    as in the Nystromformer LRA setup), 5000 steps, validation every 200.
  * ``tiny_short``: ``tiny`` on generated ListOps of 20 < tokens < 200, the
    range of the original ListOps (Nangia & Bowman, 2018); the model's
    max_length drops to 200.

  Raises:
    ValueError: for an unknown variant.
  """
  if variant in (None, ""):
    return config
  if variant not in VARIANTS:
    raise ValueError(f"unknown config variant {variant!r}; known: {VARIANTS}")
  config.model.emb_dim = 64
  config.model.num_heads = 2
  config.model.qkv_dim = 64
  config.model.mlp_dim = 128
  config.model.num_layers = 2
  config.learning_rate = 0.05
  config.warmup = 1000
  config.num_train_steps = 5000
  config.eval_frequency = 200
  config.checkpoint_every = 200
  if variant == "tiny_short":
    config.data.min_tokens = 20
    config.data.max_tokens = 200
    config.model.max_length = 200
    config.data.bucket = 32
  return config
