"""SimpleTRON Simple-Res (second skip connection) on Pathfinder-32.

``python train.py --config configs/pathfinder/simple_res.py`` runs the published size;
``configs/pathfinder/simple_res.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``simple_res`` on task ``pathfinder``; ``variant`` in ``lra.task_variants("pathfinder")``."""
  return lra.make_config("pathfinder", "simple_res", variant)
