"""SimpleTRON Simple-ResL (Simple-Res plus the output projection) on ListOps.

Settings of the SimpleTRON paper, appendix A (paper test accuracy 37.55%, best of 5 seeds).
Paper size (GPU/TPU): ``python train.py --config configs/listops/simple_resl.py``.
CPU: ``--config configs/listops/simple_resl.py:tiny`` (or ``:tiny_short`` for 20-200 tokens).
"""

from configs.listops import base


def get_config(variant=None):
  """SimpleTRON paper settings with attention ``simple_resl``; ``variant`` in ``base.VARIANTS``."""
  config = base.get_base_config()
  config.model.attention = "simple_resl"
  base.apply_simpletron_paper(config)
  return base.apply_variant(config, variant)
