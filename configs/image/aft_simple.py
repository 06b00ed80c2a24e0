"""AFT-simple on image classification (CIFAR-10 grayscale).

``python train.py --config configs/image/aft_simple.py`` runs the published size;
``configs/image/aft_simple.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``aft_simple`` on task ``image``; ``variant`` in ``lra.task_variants("image")``."""
  return lra.make_config("image", "aft_simple", variant)
