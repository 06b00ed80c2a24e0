"""The Linear Transformer (elu+1 features) on Path-X (Pathfinder-128).

``python train.py --config configs/pathx/linear.py`` runs the published size;
``configs/pathx/linear.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``linear`` on task ``pathx``; ``variant`` in ``lra.task_variants("pathx")``."""
  return lra.make_config("pathx", "linear", variant)
