"""BigBird (window, global and random blocks) on text classification (IMDB bytes).

``python train.py --config configs/text/bigbird.py`` runs the published size;
``configs/text/bigbird.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``bigbird`` on task ``text``; ``variant`` in ``lra.task_variants("text")``."""
  return lra.make_config("text", "bigbird", variant)
