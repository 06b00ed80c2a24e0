"""The Sparse Transformer (fixed strided pattern) on text classification (IMDB bytes).

``python train.py --config configs/text/sparse.py`` runs the published size;
``configs/text/sparse.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``sparse`` on task ``text``; ``variant`` in ``lra.task_variants("text")``."""
  return lra.make_config("text", "sparse", variant)
