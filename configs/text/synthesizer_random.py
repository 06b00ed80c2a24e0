"""The random Synthesizer on text classification (IMDB bytes).

``python train.py --config configs/text/synthesizer_random.py`` runs the published size;
``configs/text/synthesizer_random.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``synthesizer_random`` on task ``text``; ``variant`` in ``lra.task_variants("text")``."""
  return lra.make_config("text", "synthesizer_random", variant)
