"""AFT-simple on ListOps.

``python train.py --config configs/listops/aft_simple.py`` runs the published size;
``configs/listops/aft_simple.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``aft_simple`` on task ``listops``; ``variant`` in ``lra.task_variants("listops")``."""
  return lra.make_config("listops", "aft_simple", variant)
