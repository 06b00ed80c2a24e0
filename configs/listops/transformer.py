"""LRA Transformer (softmax attention) on ListOps, LRA's settings.

Paper size (GPU/TPU): ``python train.py --config configs/listops/transformer.py``
(LRA reports 36.37% test accuracy). CPU: ``--config configs/listops/transformer.py:tiny``.
"""

from configs.listops import base


def get_config(variant=None):
  """LRA ``listops/configs/transformer_base.py``; ``variant`` in ``base.VARIANTS``."""
  config = base.get_base_config()
  config.model.attention = "softmax"
  return base.apply_variant(config, variant)
