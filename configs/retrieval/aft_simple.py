"""AFT-simple on retrieval (AAN pairs, dual encoder).

``python train.py --config configs/retrieval/aft_simple.py`` runs the published size;
``configs/retrieval/aft_simple.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``aft_simple`` on task ``retrieval``; ``variant`` in ``lra.task_variants("retrieval")``."""
  return lra.make_config("retrieval", "aft_simple", variant)
