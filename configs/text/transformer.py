"""The LRA Transformer (softmax attention) on text classification (IMDB bytes).

``python train.py --config configs/text/transformer.py`` runs the published size;
``configs/text/transformer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``softmax`` on task ``text``; ``variant`` in ``lra.task_variants("text")``."""
  return lra.make_config("text", "softmax", variant)
