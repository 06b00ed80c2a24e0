"""The Reformer (LSH attention) on Path-X (Pathfinder-128).

``python train.py --config configs/pathx/reformer.py`` runs the published size;
``configs/pathx/reformer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``reformer`` on task ``pathx``; ``variant`` in ``lra.task_variants("pathx")``."""
  return lra.make_config("pathx", "reformer", variant)
