"""SimpleTRON Simple (no output projection) on text classification (IMDB bytes).

``python train.py --config configs/text/simple.py`` runs the published size;
``configs/text/simple.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``simple`` on task ``text``; ``variant`` in ``lra.task_variants("text")``."""
  return lra.make_config("text", "simple", variant)
