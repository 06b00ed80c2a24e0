"""AFT-full on Pathfinder-32.

``python train.py --config configs/pathfinder/aft_full.py`` runs the published size;
``configs/pathfinder/aft_full.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``aft_full`` on task ``pathfinder``; ``variant`` in ``lra.task_variants("pathfinder")``."""
  return lra.make_config("pathfinder", "aft_full", variant)
