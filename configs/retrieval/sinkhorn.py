"""The Sinkhorn Transformer on retrieval (AAN pairs, dual encoder).

``python train.py --config configs/retrieval/sinkhorn.py`` runs the published size;
``configs/retrieval/sinkhorn.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``sinkhorn`` on task ``retrieval``; ``variant`` in ``lra.task_variants("retrieval")``."""
  return lra.make_config("retrieval", "sinkhorn", variant)
