"""The Sinkhorn Transformer on Path-X (Pathfinder-128).

``python train.py --config configs/pathx/sinkhorn.py`` runs the published size;
``configs/pathx/sinkhorn.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``sinkhorn`` on task ``pathx``; ``variant`` in ``lra.task_variants("pathx")``."""
  return lra.make_config("pathx", "sinkhorn", variant)
