"""The Reformer (LSH attention) on image classification (CIFAR-10 grayscale).

``python train.py --config configs/image/reformer.py`` runs the published size;
``configs/image/reformer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``reformer`` on task ``image``; ``variant`` in ``lra.task_variants("image")``."""
  return lra.make_config("image", "reformer", variant)
