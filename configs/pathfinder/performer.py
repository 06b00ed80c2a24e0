"""The Performer (FAVOR+) on Pathfinder-32.

``python train.py --config configs/pathfinder/performer.py`` runs the published size;
``configs/pathfinder/performer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``performer`` on task ``pathfinder``; ``variant`` in ``lra.task_variants("pathfinder")``."""
  return lra.make_config("pathfinder", "performer", variant)
