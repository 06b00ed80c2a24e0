"""The Sinkhorn Transformer on Pathfinder-32.

``python train.py --config configs/pathfinder/sinkhorn.py`` runs the published size;
``configs/pathfinder/sinkhorn.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``sinkhorn`` on task ``pathfinder``; ``variant`` in ``lra.task_variants("pathfinder")``."""
  return lra.make_config("pathfinder", "sinkhorn", variant)
