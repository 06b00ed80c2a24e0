"""SimpleTRON Simple (no output projection) on ListOps.

``python train.py --config configs/listops/simple.py`` runs the published size;
``configs/listops/simple.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``simple`` on task ``listops``; ``variant`` in ``lra.task_variants("listops")``."""
  return lra.make_config("listops", "simple", variant)
