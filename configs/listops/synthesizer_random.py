"""The random Synthesizer on ListOps.

``python train.py --config configs/listops/synthesizer_random.py`` runs the published size;
``configs/listops/synthesizer_random.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``synthesizer_random`` on task ``listops``; ``variant`` in ``lra.task_variants("listops")``."""
  return lra.make_config("listops", "synthesizer_random", variant)
