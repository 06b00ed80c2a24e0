"""BigBird (window, global and random blocks) on image classification (CIFAR-10 grayscale).

``python train.py --config configs/image/bigbird.py`` runs the published size;
``configs/image/bigbird.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``bigbird`` on task ``image``; ``variant`` in ``lra.task_variants("image")``."""
  return lra.make_config("image", "bigbird", variant)
