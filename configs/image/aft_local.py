"""AFT-local on image classification (CIFAR-10 grayscale).

``python train.py --config configs/image/aft_local.py`` runs the published size;
``configs/image/aft_local.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``aft_local`` on task ``image``; ``variant`` in ``lra.task_variants("image")``."""
  return lra.make_config("image", "aft_local", variant)
