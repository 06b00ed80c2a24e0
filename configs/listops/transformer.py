"""The LRA Transformer (softmax attention) on ListOps.

``python train.py --config configs/listops/transformer.py`` runs the published size;
``configs/listops/transformer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``softmax`` on task ``listops``; ``variant`` in ``lra.task_variants("listops")``."""
  return lra.make_config("listops", "softmax", variant)
