"""Longformer (sliding window and global CLS) on ListOps.

``python train.py --config configs/listops/longformer.py`` runs the published size;
``configs/listops/longformer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``longformer`` on task ``listops``; ``variant`` in ``lra.task_variants("listops")``."""
  return lra.make_config("listops", "longformer", variant)
