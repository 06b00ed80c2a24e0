"""The Performer (FAVOR+) on text classification (IMDB bytes).

``python train.py --config configs/text/performer.py`` runs the published size;
``configs/text/performer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``performer`` on task ``text``; ``variant`` in ``lra.task_variants("text")``."""
  return lra.make_config("text", "performer", variant)
