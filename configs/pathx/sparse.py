"""The Sparse Transformer (fixed strided pattern) on Path-X (Pathfinder-128).

``python train.py --config configs/pathx/sparse.py`` runs the published size;
``configs/pathx/sparse.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``sparse`` on task ``pathx``; ``variant`` in ``lra.task_variants("pathx")``."""
  return lra.make_config("pathx", "sparse", variant)
