"""SimpleTRON Simple-Res (second skip connection) on ListOps.

``python train.py --config configs/listops/simple_res.py`` runs the published size;
``configs/listops/simple_res.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``simple_res`` on task ``listops``; ``variant`` in ``lra.task_variants("listops")``."""
  return lra.make_config("listops", "simple_res", variant)
