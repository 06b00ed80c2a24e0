"""SimpleTRON (Simple-ResL attention in BERT's encoder) on AG News (SimpleTRON section 5.3).

From scratch (the paper: 89.9%; Table 2 by depth)::

    python train.py --config configs/agnews/simple_resl.py \
        --config.data.data_dir=~/data/ag_news_csv --config.data.vocab_path=~/bert-base-cased

From BERT's weights (the paper: 92.7% with 12 blocks, 92.3% with 6)::

    python -m simpletron_jax.tools.bert_import ~/bert-base-cased runs/bert_init
    python train.py --config configs/agnews/simple_resl.py:from_bert \
        --config.init_from=runs/bert_init --config.data.data_dir=~/data/ag_news_csv \
        --config.data.vocab_path=~/bert-base-cased [--config.model.num_layers=6]

The authors' code loaded BERT's attention output projection but never applied it, so what
their logged run computed is Simple-Res: ``--config.model.attention=simple_res`` (it still
lacks their extra ``1/sqrt(head_dim)`` on ``K^T V``; docs/bert.md). ``:tiny`` and
``:tiny_from_bert`` are CPU sizes. Settings: ``configs/lra.py`` (``_agnews``).
"""

from configs import lra


def get_config(variant=None):
  """Attention ``simple_resl`` on task ``agnews``; ``variant`` in ``lra.task_variants("agnews")``."""
  return lra.make_config("agnews", "simple_resl", variant)
