"""SimpleTRON Simple-ResL (second skip and output projection) on text classification (IMDB bytes).

``python train.py --config configs/text/simple_resl.py`` runs the published size;
``configs/text/simple_resl.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``simple_resl`` on task ``text``; ``variant`` in ``lra.task_variants("text")``."""
  return lra.make_config("text", "simple_resl", variant)
