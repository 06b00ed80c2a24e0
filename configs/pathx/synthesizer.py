"""The dense Synthesizer on Path-X (Pathfinder-128).

``python train.py --config configs/pathx/synthesizer.py`` runs the published size;
``configs/pathx/synthesizer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``synthesizer`` on task ``pathx``; ``variant`` in ``lra.task_variants("pathx")``."""
  return lra.make_config("pathx", "synthesizer", variant)
