"""Longformer (sliding window and global CLS) on text classification (IMDB bytes).

``python train.py --config configs/text/longformer.py`` runs the published size;
``configs/text/longformer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``longformer`` on task ``text``; ``variant`` in ``lra.task_variants("text")``."""
  return lra.make_config("text", "longformer", variant)
