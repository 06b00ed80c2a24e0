"""AFT-full on retrieval (AAN pairs, dual encoder).

``python train.py --config configs/retrieval/aft_full.py`` runs the published size;
``configs/retrieval/aft_full.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``aft_full`` on task ``retrieval``; ``variant`` in ``lra.task_variants("retrieval")``."""
  return lra.make_config("retrieval", "aft_full", variant)
