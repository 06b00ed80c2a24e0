"""AFT-local on retrieval (AAN pairs, dual encoder).

``python train.py --config configs/retrieval/aft_local.py`` runs the published size;
``configs/retrieval/aft_local.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``aft_local`` on task ``retrieval``; ``variant`` in ``lra.task_variants("retrieval")``."""
  return lra.make_config("retrieval", "aft_local", variant)
