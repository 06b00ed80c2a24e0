"""SimpleTRON Simple-Res (Simple plus the second skip connection) on ListOps.

Settings of the SimpleTRON paper, appendix A (paper test accuracy 37.10%, best of 5 seeds).
Paper size (GPU/TPU): ``python train.py --config configs/listops/simple_res.py``.
CPU: ``--config configs/listops/simple_res.py:tiny`` (or ``:tiny_short`` for 20-200 tokens).
"""

from configs.listops import base


def get_config(variant=None):
  """SimpleTRON paper settings with attention ``simple_res``; ``variant`` in ``base.VARIANTS``."""
  config = base.get_base_config()
  config.model.attention = "simple_res"
  base.apply_simpletron_paper(config)
  return base.apply_variant(config, variant)
