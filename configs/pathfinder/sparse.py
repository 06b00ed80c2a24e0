"""The Sparse Transformer (fixed strided pattern) on Pathfinder-32.

``python train.py --config configs/pathfinder/sparse.py`` runs the published size;
``configs/pathfinder/sparse.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``sparse`` on task ``pathfinder``; ``variant`` in ``lra.task_variants("pathfinder")``."""
  return lra.make_config("pathfinder", "sparse", variant)
