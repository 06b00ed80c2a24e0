"""The Linear Transformer (elu+1 features) on image classification (CIFAR-10 grayscale).

``python train.py --config configs/image/linear.py`` runs the published size;
``configs/image/linear.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``linear`` on task ``image``; ``variant`` in ``lra.task_variants("image")``."""
  return lra.make_config("image", "linear", variant)
