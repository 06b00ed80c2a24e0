"""BigBird (window, global and random blocks) on Pathfinder-32.

``python train.py --config configs/pathfinder/bigbird.py`` runs the published size;
``configs/pathfinder/bigbird.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``bigbird`` on task ``pathfinder``; ``variant`` in ``lra.task_variants("pathfinder")``."""
  return lra.make_config("pathfinder", "bigbird", variant)
