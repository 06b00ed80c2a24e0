"""The Sparse Transformer (fixed strided pattern) on image classification (CIFAR-10 grayscale).

``python train.py --config configs/image/sparse.py`` runs the published size;
``configs/image/sparse.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``sparse`` on task ``image``; ``variant`` in ``lra.task_variants("image")``."""
  return lra.make_config("image", "sparse", variant)
