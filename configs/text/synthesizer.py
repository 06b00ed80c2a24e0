"""The dense Synthesizer on text classification (IMDB bytes).

``python train.py --config configs/text/synthesizer.py`` runs the published size;
``configs/text/synthesizer.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``synthesizer`` on task ``text``; ``variant`` in ``lra.task_variants("text")``."""
  return lra.make_config("text", "synthesizer", variant)
