"""The Reformer (LSH attention) on Pathfinder-32.

``python train.py --config configs/pathfinder/reformer.py`` runs the published size;
``configs/pathfinder/reformer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``reformer`` on task ``pathfinder``; ``variant`` in ``lra.task_variants("pathfinder")``."""
  return lra.make_config("pathfinder", "reformer", variant)
