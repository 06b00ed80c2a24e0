"""AFT-full on image classification (CIFAR-10 grayscale).

``python train.py --config configs/image/aft_full.py`` runs the published size;
``configs/image/aft_full.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``aft_full`` on task ``image``; ``variant`` in ``lra.task_variants("image")``."""
  return lra.make_config("image", "aft_full", variant)
