"""The Sinkhorn Transformer on image classification (CIFAR-10 grayscale).

``python train.py --config configs/image/sinkhorn.py`` runs the published size;
``configs/image/sinkhorn.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``sinkhorn`` on task ``image``; ``variant`` in ``lra.task_variants("image")``."""
  return lra.make_config("image", "sinkhorn", variant)
