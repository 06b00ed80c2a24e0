"""Linformer on ListOps.

``python train.py --config configs/listops/linformer.py`` runs the published size;
``configs/listops/linformer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``linformer`` on task ``listops``; ``variant`` in ``lra.task_variants("listops")``."""
  return lra.make_config("listops", "linformer", variant)
