"""BERT (softmax attention) on AG News: the paper's "BERT" rows (SimpleTRON section 5.3).

From scratch (the paper: 91.1%; Table 2 by depth)::

    python train.py --config configs/agnews/transformer.py \
        --config.data.data_dir=~/data/ag_news_csv --config.data.vocab_path=~/bert-base-cased

From BERT's weights (the paper: 94.2% with 12 blocks, 92.7% with 6)::

    python -m simpletron_jax.tools.bert_import ~/bert-base-cased runs/bert_init
    python train.py --config configs/agnews/transformer.py:from_bert \
        --config.init_from=runs/bert_init --config.data.data_dir=~/data/ag_news_csv \
        --config.data.vocab_path=~/bert-base-cased [--config.model.num_layers=6]

``:tiny`` and ``:tiny_from_bert`` are CPU sizes. Settings: ``configs/lra.py`` (``_agnews``).
"""

from configs import lra


def get_config(variant=None):
  """Attention ``softmax`` on task ``agnews``; ``variant`` in ``lra.task_variants("agnews")``."""
  return lra.make_config("agnews", "softmax", variant)
