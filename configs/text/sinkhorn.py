"""The Sinkhorn Transformer on text classification (IMDB bytes).

``python train.py --config configs/text/sinkhorn.py`` runs the published size;
``configs/text/sinkhorn.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``sinkhorn`` on task ``text``; ``variant`` in ``lra.task_variants("text")``."""
  return lra.make_config("text", "sinkhorn", variant)
