"""SimpleTRON Simple-ResL (second skip and output projection) on ListOps.

``python train.py --config configs/listops/simple_resl.py`` runs the published size;
``configs/listops/simple_resl.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``simple_resl`` on task ``listops``; ``variant`` in ``lra.task_variants("listops")``."""
  return lra.make_config("listops", "simple_resl", variant)
