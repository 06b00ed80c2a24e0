"""BigBird (window, global and random blocks) on ListOps.

``python train.py --config configs/listops/bigbird.py`` runs the published size;
``configs/listops/bigbird.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``bigbird`` on task ``listops``; ``variant`` in ``lra.task_variants("listops")``."""
  return lra.make_config("listops", "bigbird", variant)
