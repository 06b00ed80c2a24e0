"""Linformer on text classification (IMDB bytes).

``python train.py --config configs/text/linformer.py`` runs the published size;
``configs/text/linformer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``linformer`` on task ``text``; ``variant`` in ``lra.task_variants("text")``."""
  return lra.make_config("text", "linformer", variant)
