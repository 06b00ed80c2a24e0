"""The Performer (FAVOR+) on retrieval (AAN pairs, dual encoder).

``python train.py --config configs/retrieval/performer.py`` runs the published size;
``configs/retrieval/performer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``performer`` on task ``retrieval``; ``variant`` in ``lra.task_variants("retrieval")``."""
  return lra.make_config("retrieval", "performer", variant)
