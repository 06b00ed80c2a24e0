"""Local (block) attention on ListOps.

``python train.py --config configs/listops/local.py`` runs the published size;
``configs/listops/local.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``local`` on task ``listops``; ``variant`` in ``lra.task_variants("listops")``."""
  return lra.make_config("listops", "local", variant)
