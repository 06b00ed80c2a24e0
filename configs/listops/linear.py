"""The Linear Transformer (elu+1 features) on ListOps.

``python train.py --config configs/listops/linear.py`` runs the published size;
``configs/listops/linear.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``linear`` on task ``listops``; ``variant`` in ``lra.task_variants("listops")``."""
  return lra.make_config("listops", "linear", variant)
