"""SimpleTRON Simple-ResL (second skip and output projection) on retrieval (AAN pairs, dual encoder).

``python train.py --config configs/retrieval/simple_resl.py`` runs the published size;
``configs/retrieval/simple_resl.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``simple_resl`` on task ``retrieval``; ``variant`` in ``lra.task_variants("retrieval")``."""
  return lra.make_config("retrieval", "simple_resl", variant)
