"""Local (block) attention on Path-X (Pathfinder-128).

``python train.py --config configs/pathx/local.py`` runs the published size;
``configs/pathx/local.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``local`` on task ``pathx``; ``variant`` in ``lra.task_variants("pathx")``."""
  return lra.make_config("pathx", "local", variant)
