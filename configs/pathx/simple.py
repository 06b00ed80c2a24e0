"""SimpleTRON Simple (no output projection) on Path-X (Pathfinder-128).

``python train.py --config configs/pathx/simple.py`` runs the published size;
``configs/pathx/simple.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``simple`` on task ``pathx``; ``variant`` in ``lra.task_variants("pathx")``."""
  return lra.make_config("pathx", "simple", variant)
