"""Longformer (sliding window and global CLS) on Path-X (Pathfinder-128).

``python train.py --config configs/pathx/longformer.py`` runs the published size;
``configs/pathx/longformer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``longformer`` on task ``pathx``; ``variant`` in ``lra.task_variants("pathx")``."""
  return lra.make_config("pathx", "longformer", variant)
