"""The Reformer (LSH attention) on ListOps.

``python train.py --config configs/listops/reformer.py`` runs the published size;
``configs/listops/reformer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``reformer`` on task ``listops``; ``variant`` in ``lra.task_variants("listops")``."""
  return lra.make_config("listops", "reformer", variant)
