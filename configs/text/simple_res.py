"""SimpleTRON Simple-Res (second skip connection) on text classification (IMDB bytes).

``python train.py --config configs/text/simple_res.py`` runs the published size;
``configs/text/simple_res.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``simple_res`` on task ``text``; ``variant`` in ``lra.task_variants("text")``."""
  return lra.make_config("text", "simple_res", variant)
