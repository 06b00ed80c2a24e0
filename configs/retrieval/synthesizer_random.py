"""The random Synthesizer on retrieval (AAN pairs, dual encoder).

``python train.py --config configs/retrieval/synthesizer_random.py`` runs the published size;
``configs/retrieval/synthesizer_random.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``synthesizer_random`` on task ``retrieval``; ``variant`` in ``lra.task_variants("retrieval")``."""
  return lra.make_config("retrieval", "synthesizer_random", variant)
