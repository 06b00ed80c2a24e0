"""The Reformer (LSH attention) on text classification (IMDB bytes).

``python train.py --config configs/text/reformer.py`` runs the published size;
``configs/text/reformer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``reformer`` on task ``text``; ``variant`` in ``lra.task_variants("text")``."""
  return lra.make_config("text", "reformer", variant)
