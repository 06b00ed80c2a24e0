"""The LRA baselines' configs against values transcribed from LRA's own config files
(google-research/long-range-arena at cd31e5c, ``lra_benchmarks/*/configs/``), and the
``:authors`` variants against the SimpleTRON authors' notebooks (docs/fidelity.md)."""

import dataclasses

import pytest

from configs import lra
from simpletron_jax.data import tasks
from simpletron_jax.experiments import attentions, recipes
from simpletron_jax.model import encoders, model_config

# The tasks with SimpleTRON's appendix A settings, which have the :authors variants.
AUTHORS_TASKS = tuple(t for t in tasks.names() if recipes.get(t).simpletron is not None)

# image/configs/cifar10/<file>: (layers, heads, emb, qkv, mlp, dropout, pool, block_size).
# bigbird_base.py writes ``num_head = 4`` (sic), so num_heads is the base file's 1;
# sinkhorn_base.py keeps the base sizes (emb 32, 1 head, qkv 32, mlp 64), dropout 0.1.
CIFAR10 = {
    "softmax": (1, 8, 128, 64, 128, 0.3, "CLS", None),             # transformer_base.py
    "bigbird": (1, 1, 128, 64, 128, 0.3, "CLS", 64),               # bigbird_base.py
    "linear": (1, 8, 128, 64, 128, 0.3, "CLS", None),              # linear_transformer_base.py
    "linformer": (1, 8, 128, 64, 128, 0.3, "CLS", None),           # linformer_base.py
    "local": (1, 2, 128, 64, 128, 0.3, "MEAN", 64),                # local_base.py
    "longformer": (4, 4, 128, 64, 128, 0.3, "MEAN", None),         # longformer_base.py
    "performer": (1, 8, 128, 64, 128, 0.3, "CLS", None),           # performer_base.py
    # reformer_base.py says qkv 32; LRA's ReformerAttention uses the input width, emb 64.
    "reformer": (4, 8, 64, 64, 64, 0.3, "CLS", None),              # reformer_base.py
    # base CLS, but SinkhornTransformerEncoder raises for CLS: MEAN, its only pooling.
    "sinkhorn": (1, 1, 32, 32, 64, 0.1, "MEAN", 64),               # sinkhorn_base.py
    "sparse": (1, 8, 128, 64, 128, 0.3, "CLS", None),              # sparse_transformer_base.py
    "synthesizer_random": (1, 8, 128, 64, 128, 0.3, "CLS", None),  # synthesizer_base.py
}
# image/configs/pathfinder32/<file>; MEAN pooling throughout (base_pathfinder32_config.py).
PATHFINDER32 = {
    "softmax": (4, 4, 32, 16, 32, 0.2, "MEAN", None),
    "bigbird": (4, 2, 64, 32, 64, 0.2, "MEAN", 64),
    "linear": (1, 2, 128, 64, 128, 0.2, "MEAN", None),
    "linformer": (1, 2, 32, 16, 32, 0.2, "MEAN", None),
    "local": (2, 4, 64, 32, 64, 0.1, "MEAN", 64),
    "longformer": (2, 2, 32, 16, 32, 0.1, "MEAN", None),
    "performer": (4, 8, 32, 16, 32, 0.2, "MEAN", None),
    "reformer": (2, 8, 64, 64, 64, 0.2, "MEAN", None),   # qkv: the input width, as CIFAR
    "sinkhorn": (2, 4, 32, 16, 64, 0.2, "MEAN", 64),
    "sparse": (1, 8, 32, 16, 32, 0.2, "MEAN", None),
    "synthesizer_random": (2, 4, 64, 32, 64, 0.2, "MEAN", None),
}


def _sizes(config, block_size):
  """The table's fields of ``config``; the block size only where LRA's file sets one."""
  m = config.model
  kwargs = dict(m.attention_kwargs)
  return (m.num_layers, m.num_heads, m.emb_dim, m.qkv_dim, m.mlp_dim, m.dropout_rate,
          m.classifier_pool, kwargs["block_size"] if block_size else None)


@pytest.mark.parametrize("task,table", [("image", CIFAR10), ("pathfinder", PATHFINDER32)])
def test_image_and_pathfinder_sizes_per_variant(task, table):
  for name, expected in table.items():
    assert _sizes(lra.make_config(task, name), expected[-1]) == expected, name
  assert lra.make_config("image", "sinkhorn").weight_decay == 0.7
  assert lra.make_config("image", "softmax").weight_decay == 0.0


def test_attention_options_per_task():
  for task in tasks.lra_tasks():
    kwargs = dict(lra.make_config(task, "performer").model.attention_kwargs)
    if task == "listops":  # listops/configs/performer_base.py
      assert (kwargs["kernel"], kwargs["num_features"], kwargs["redraw"]) == ("softmax", 2, True)
    else:  # performer.py default: make_fast_generalized_attention, deterministic features
      assert kwargs["kernel"] == "relu_deterministic"
    assert dict(lra.make_config(task, "linformer").model.attention_kwargs)["k"] == 16
    assert dict(lra.make_config(task, "synthesizer_random").model.attention_kwargs)[
        "dot_product"] is True
    for name in ("linear", "performer", "linformer"):
      assert dict(lra.make_config(task, name).model.attention_kwargs)["lra_masking"] is False


def test_sinkhorn_config_is_lras_encoder():
  """SinkhornTransformerEncoder: MEAN pooling and one Dense head on every task but
  retrieval (its dual encoder pools CLS with classifier_head_dual); sinkhorn_attention.py's
  25 sort outputs and row-softmax sort; LRA's bugs off."""
  for task in tasks.lra_tasks():
    m = lra.make_config(task, "sinkhorn").model
    kwargs = dict(m.attention_kwargs)
    expected = ("CLS", "mlp") if task == "retrieval" else ("MEAN", "dense")
    assert (m.classifier_pool, m.head) == expected, task
    assert (kwargs["max_num_blocks"], kwargs["sort"], kwargs["joint_softmax"],
            kwargs["lra_bugs"]) == (25, "softmax", False, False), task


@pytest.mark.parametrize("task", tasks.lra_tasks())
@pytest.mark.parametrize("variant", [None, "tiny"])
def test_reformer_config_is_lras_structure(task, variant):
  """reformer_attention.py: 10 buckets = 10 chunks per round (module defaults), no output
  projection, so qkv_dim is the input width; LRA's bugs off (``lra_bugs`` present for the
  command line)."""
  config = lra.make_config(task, "reformer", variant)
  kwargs = dict(config.model.attention_kwargs)
  assert (kwargs["num_buckets"], kwargs["num_hashes"], kwargs["lra_bugs"]) == (10, 1, False)
  assert "chunk_length" not in kwargs
  assert config.model.qkv_dim == config.model.emb_dim
  encoders.ModelConfig.from_config_dict(config.model)


def test_text_length_and_retrieval_interaction():
  for name in ("softmax", "linear", "performer", "reformer", "aft_simple"):
    assert lra.make_config("text", name).model.max_length == 1000  # base_tc_config.py
  for name in attentions.simpletron_names():
    assert lra.make_config("text", name).model.max_length == 4000  # SimpleTRON appendix A
  # classifier_head_dual(interaction=None): [u, v]
  assert lra.make_config("retrieval", "softmax").model.interaction == "concat"


def test_other_configs_keep_the_default_function():
  """Outside the authors variants, every option is at the default (correct) value."""
  for task in tasks.lra_tasks():
    for name in ("simple", "simple_resl", "softmax", "linear", "performer", "linformer"):
      for variant in (None, "tiny"):
        config = lra.make_config(task, name, variant)
        typed = encoders.ModelConfig.from_config_dict(config.model)
        for field in dataclasses.fields(encoders.ModelConfig):
          if field.name not in model_config.SIZES and field.name not in (
              "attention", "attention_kwargs", "dropout_rate", "attention_dropout_rate",
              "learn_pos_emb", "classifier_pool", "head", "interaction", "dtype"):
            assert getattr(typed, field.name) == field.default, (task, name, field.name)
        kwargs = dict(config.model.attention_kwargs)
        assert kwargs.get("lra_masking", False) is False
        assert (kwargs.get("normalizer", "real"), kwargs.get("mask_pads", True),
                kwargs.get("kv_dropout_rate", 0.0)) == ("real", True, 0.0)
        assert config.data.get("lra_pixel_mask", False) is False


@pytest.mark.parametrize("task", AUTHORS_TASKS)
def test_authors_variants(task):
  for variant in ("authors", "tiny_authors"):
    config = lra.make_config(task, "simple", variant)
    kwargs = dict(config.model.attention_kwargs)
    assert (kwargs["normalizer"], kwargs["mask_pads"], kwargs["kv_dropout_rate"]) == (
        "padded", False, 0.1)
    m = config.model
    assert config.data.bucket == 0
    assert (m.pos_emb_init, m.learn_pos_emb, m.embedding_dropout,
            m.attention_branch_dropout, m.zero_pad_embedding) == ("zeros", True, False, False,
                                                                  True)
    matching = task == "retrieval"
    assert m.head_activation == ("relu" if matching else "gelu")
    assert m.final_layer_norm is not matching
  size = lra.make_config(task, "simple_res", "tiny_authors").model
  tiny = lra.make_config(task, "simple_res", "tiny").model
  assert (size.num_layers, size.emb_dim, size.num_heads, size.max_length) == (
      tiny.num_layers, tiny.emb_dim, tiny.num_heads, tiny.max_length)
  # SimpleAttention(512, 512, 8) and (128, 128, 8) in the ListOps and matching notebooks;
  # text keeps the paper's 4 (its notebook is not in the snapshot read).
  heads = {"listops": 8, "text": 4, "retrieval": 8}[task]
  assert lra.make_config(task, "simple", "authors").model.num_heads == heads
  assert "authors" not in lra.variants(task, "linear")


@pytest.mark.parametrize("task", tasks.lra_tasks())
def test_lra_code_variant_sets_lras_bugs_and_data(task):
  """``:lra_code`` = the LRA config (LRA's design choices) + every option of LRA's bugs
  (the same options the golden tests use, tests/test_lra_golden.py) + LRA's data handling."""
  for attention in attentions.lra_baselines():
    bugs = attentions.get(attention).lra_bug_options
    config = lra.make_config(task, attention, "tiny_lra_code")
    m = config.model
    for key, value in bugs.items():
      assert m.attention_kwargs[key] == value, (attention, key)
    assert m.lra_mean_over_pads is (m.classifier_pool == "MEAN")
    assert m.lra_cls_mask and config.data.bucket == 0
    assert m.get("lra_dual_no_cls", False) is (task == "retrieval")
    if "max_length" in m.attention_kwargs:   # no CLS row without a prepended CLS
      with_cls = m.classifier_pool == "CLS" and task != "retrieval"
      assert m.attention_kwargs.max_length == m.max_length + with_cls, attention
    assert m.attention_bias is False
  default = lra.make_config(task, "softmax")
  assert not default.model.lra_mean_over_pads and not default.model.lra_cls_mask
  assert default.model.attention_kwargs.lra_masking is False
  assert "lra_code" not in lra.variants(task, "simple")
  with pytest.raises(ValueError, match="LRA's code: attention must be one of"):
    lra.make_config(task, "simple", "lra_code")
