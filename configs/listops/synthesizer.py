"""The dense Synthesizer on ListOps.

``python train.py --config configs/listops/synthesizer.py`` runs the published size;
``configs/listops/synthesizer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``synthesizer`` on task ``listops``; ``variant`` in ``lra.task_variants("listops")``."""
  return lra.make_config("listops", "synthesizer", variant)
