"""Longformer (sliding window and global CLS) on retrieval (AAN pairs, dual encoder).

``python train.py --config configs/retrieval/longformer.py`` runs the published size;
``configs/retrieval/longformer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``longformer`` on task ``retrieval``; ``variant`` in ``lra.task_variants("retrieval")``."""
  return lra.make_config("retrieval", "longformer", variant)
