"""SimpleTRON Simple-ResL (second skip and output projection) on Path-X (Pathfinder-128).

``python train.py --config configs/pathx/simple_resl.py`` runs the published size;
``configs/pathx/simple_resl.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``simple_resl`` on task ``pathx``; ``variant`` in ``lra.task_variants("pathx")``."""
  return lra.make_config("pathx", "simple_resl", variant)
