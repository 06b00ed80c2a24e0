"""The LRA Transformer (softmax attention) on Pathfinder-32.

``python train.py --config configs/pathfinder/transformer.py`` runs the published size;
``configs/pathfinder/transformer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``softmax`` on task ``pathfinder``; ``variant`` in ``lra.task_variants("pathfinder")``."""
  return lra.make_config("pathfinder", "softmax", variant)
