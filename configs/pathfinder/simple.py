"""SimpleTRON Simple (no output projection) on Pathfinder-32.

``python train.py --config configs/pathfinder/simple.py`` runs the published size;
``configs/pathfinder/simple.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``simple`` on task ``pathfinder``; ``variant`` in ``lra.task_variants("pathfinder")``."""
  return lra.make_config("pathfinder", "simple", variant)
