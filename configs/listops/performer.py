"""The Performer (FAVOR+) on ListOps.

``python train.py --config configs/listops/performer.py`` runs the published size;
``configs/listops/performer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``performer`` on task ``listops``; ``variant`` in ``lra.task_variants("listops")``."""
  return lra.make_config("listops", "performer", variant)
