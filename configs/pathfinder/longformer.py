"""Longformer (sliding window and global CLS) on Pathfinder-32.

``python train.py --config configs/pathfinder/longformer.py`` runs the published size;
``configs/pathfinder/longformer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``longformer`` on task ``pathfinder``; ``variant`` in ``lra.task_variants("pathfinder")``."""
  return lra.make_config("pathfinder", "longformer", variant)
