"""The random Synthesizer on Path-X (Pathfinder-128).

``python train.py --config configs/pathx/synthesizer_random.py`` runs the published size;
``configs/pathx/synthesizer_random.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``synthesizer_random`` on task ``pathx``; ``variant`` in ``lra.task_variants("pathx")``."""
  return lra.make_config("pathx", "synthesizer_random", variant)
