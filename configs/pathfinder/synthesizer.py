"""The dense Synthesizer on Pathfinder-32.

``python train.py --config configs/pathfinder/synthesizer.py`` runs the published size;
``configs/pathfinder/synthesizer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``synthesizer`` on task ``pathfinder``; ``variant`` in ``lra.task_variants("pathfinder")``."""
  return lra.make_config("pathfinder", "synthesizer", variant)
