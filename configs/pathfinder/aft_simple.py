"""AFT-simple on Pathfinder-32.

``python train.py --config configs/pathfinder/aft_simple.py`` runs the published size;
``configs/pathfinder/aft_simple.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``aft_simple`` on task ``pathfinder``; ``variant`` in ``lra.task_variants("pathfinder")``."""
  return lra.make_config("pathfinder", "aft_simple", variant)
