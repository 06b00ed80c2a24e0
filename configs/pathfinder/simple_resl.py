"""SimpleTRON Simple-ResL (second skip and output projection) on Pathfinder-32.

``python train.py --config configs/pathfinder/simple_resl.py`` runs the published size;
``configs/pathfinder/simple_resl.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``simple_resl`` on task ``pathfinder``; ``variant`` in ``lra.task_variants("pathfinder")``."""
  return lra.make_config("pathfinder", "simple_resl", variant)
