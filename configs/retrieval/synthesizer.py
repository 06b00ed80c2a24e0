"""The dense Synthesizer on retrieval (AAN pairs, dual encoder).

``python train.py --config configs/retrieval/synthesizer.py`` runs the published size;
``configs/retrieval/synthesizer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``synthesizer`` on task ``retrieval``; ``variant`` in ``lra.task_variants("retrieval")``."""
  return lra.make_config("retrieval", "synthesizer", variant)
