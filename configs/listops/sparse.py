"""The Sparse Transformer (fixed strided pattern) on ListOps.

``python train.py --config configs/listops/sparse.py`` runs the published size;
``configs/listops/sparse.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``sparse`` on task ``listops``; ``variant`` in ``lra.task_variants("listops")``."""
  return lra.make_config("listops", "sparse", variant)
