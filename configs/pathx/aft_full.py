"""AFT-full on Path-X (Pathfinder-128).

``python train.py --config configs/pathx/aft_full.py`` runs the published size;
``configs/pathx/aft_full.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``aft_full`` on task ``pathx``; ``variant`` in ``lra.task_variants("pathx")``."""
  return lra.make_config("pathx", "aft_full", variant)
