"""The Linear Transformer (elu+1 features) on Pathfinder-32.

``python train.py --config configs/pathfinder/linear.py`` runs the published size;
``configs/pathfinder/linear.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``linear`` on task ``pathfinder``; ``variant`` in ``lra.task_variants("pathfinder")``."""
  return lra.make_config("pathfinder", "linear", variant)
