"""AFT-full on text classification (IMDB bytes).

``python train.py --config configs/text/aft_full.py`` runs the published size;
``configs/text/aft_full.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``aft_full`` on task ``text``; ``variant`` in ``lra.task_variants("text")``."""
  return lra.make_config("text", "aft_full", variant)
