"""The random Synthesizer on Pathfinder-32.

``python train.py --config configs/pathfinder/synthesizer_random.py`` runs the published size;
``configs/pathfinder/synthesizer_random.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``synthesizer_random`` on task ``pathfinder``; ``variant`` in ``lra.task_variants("pathfinder")``."""
  return lra.make_config("pathfinder", "synthesizer_random", variant)
