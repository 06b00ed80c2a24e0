"""AFT-full on ListOps.

``python train.py --config configs/listops/aft_full.py`` runs the published size;
``configs/listops/aft_full.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``aft_full`` on task ``listops``; ``variant`` in ``lra.task_variants("listops")``."""
  return lra.make_config("listops", "aft_full", variant)
