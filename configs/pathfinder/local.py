"""Local (block) attention on Pathfinder-32.

``python train.py --config configs/pathfinder/local.py`` runs the published size;
``configs/pathfinder/local.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``local`` on task ``pathfinder``; ``variant`` in ``lra.task_variants("pathfinder")``."""
  return lra.make_config("pathfinder", "local", variant)
