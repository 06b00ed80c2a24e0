"""The Linear Transformer (elu+1 features) on text classification (IMDB bytes).

``python train.py --config configs/text/linear.py`` runs the published size;
``configs/text/linear.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``linear`` on task ``text``; ``variant`` in ``lra.task_variants("text")``."""
  return lra.make_config("text", "linear", variant)
