"""The Linear Transformer (elu+1 features) on retrieval (AAN pairs, dual encoder).

``python train.py --config configs/retrieval/linear.py`` runs the published size;
``configs/retrieval/linear.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``linear`` on task ``retrieval``; ``variant`` in ``lra.task_variants("retrieval")``."""
  return lra.make_config("retrieval", "linear", variant)
