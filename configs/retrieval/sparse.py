"""The Sparse Transformer (fixed strided pattern) on retrieval (AAN pairs, dual encoder).

``python train.py --config configs/retrieval/sparse.py`` runs the published size;
``configs/retrieval/sparse.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``sparse`` on task ``retrieval``; ``variant`` in ``lra.task_variants("retrieval")``."""
  return lra.make_config("retrieval", "sparse", variant)
