"""The random Synthesizer on image classification (CIFAR-10 grayscale).

``python train.py --config configs/image/synthesizer_random.py`` runs the published size;
``configs/image/synthesizer_random.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``synthesizer_random`` on task ``image``; ``variant`` in ``lra.task_variants("image")``."""
  return lra.make_config("image", "synthesizer_random", variant)
