"""SimpleTRON Simple-Res (second skip connection) on Path-X (Pathfinder-128).

``python train.py --config configs/pathx/simple_res.py`` runs the published size;
``configs/pathx/simple_res.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``simple_res`` on task ``pathx``; ``variant`` in ``lra.task_variants("pathx")``."""
  return lra.make_config("pathx", "simple_res", variant)
