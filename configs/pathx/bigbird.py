"""BigBird (window, global and random blocks) on Path-X (Pathfinder-128).

``python train.py --config configs/pathx/bigbird.py`` runs the published size;
``configs/pathx/bigbird.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``bigbird`` on task ``pathx``; ``variant`` in ``lra.task_variants("pathx")``."""
  return lra.make_config("pathx", "bigbird", variant)
