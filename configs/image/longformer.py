"""Longformer (sliding window and global CLS) on image classification (CIFAR-10 grayscale).

``python train.py --config configs/image/longformer.py`` runs the published size;
``configs/image/longformer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``longformer`` on task ``image``; ``variant`` in ``lra.task_variants("image")``."""
  return lra.make_config("image", "longformer", variant)
