"""AFT-local on Path-X (Pathfinder-128).

``python train.py --config configs/pathx/aft_local.py`` runs the published size;
``configs/pathx/aft_local.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``aft_local`` on task ``pathx``; ``variant`` in ``lra.task_variants("pathx")``."""
  return lra.make_config("pathx", "aft_local", variant)
