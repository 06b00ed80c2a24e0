"""The LRA Transformer (softmax attention) on retrieval (AAN pairs, dual encoder).

``python train.py --config configs/retrieval/transformer.py`` runs the published size;
``configs/retrieval/transformer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``softmax`` on task ``retrieval``; ``variant`` in ``lra.task_variants("retrieval")``."""
  return lra.make_config("retrieval", "softmax", variant)
