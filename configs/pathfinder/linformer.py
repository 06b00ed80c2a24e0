"""Linformer on Pathfinder-32.

``python train.py --config configs/pathfinder/linformer.py`` runs the published size;
``configs/pathfinder/linformer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``linformer`` on task ``pathfinder``; ``variant`` in ``lra.task_variants("pathfinder")``."""
  return lra.make_config("pathfinder", "linformer", variant)
