"""SimpleTRON Simple-ResL (second skip and output projection) on image classification (CIFAR-10 grayscale).

``python train.py --config configs/image/simple_resl.py`` runs the published size;
``configs/image/simple_resl.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``simple_resl`` on task ``image``; ``variant`` in ``lra.task_variants("image")``."""
  return lra.make_config("image", "simple_resl", variant)
