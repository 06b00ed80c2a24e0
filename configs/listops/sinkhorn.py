"""The Sinkhorn Transformer on ListOps.

``python train.py --config configs/listops/sinkhorn.py`` runs the published size;
``configs/listops/sinkhorn.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``sinkhorn`` on task ``listops``; ``variant`` in ``lra.task_variants("listops")``."""
  return lra.make_config("listops", "sinkhorn", variant)
