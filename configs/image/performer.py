"""The Performer (FAVOR+) on image classification (CIFAR-10 grayscale).

``python train.py --config configs/image/performer.py`` runs the published size;
``configs/image/performer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``performer`` on task ``image``; ``variant`` in ``lra.task_variants("image")``."""
  return lra.make_config("image", "performer", variant)
