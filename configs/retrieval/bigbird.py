"""BigBird (window, global and random blocks) on retrieval (AAN pairs, dual encoder).

``python train.py --config configs/retrieval/bigbird.py`` runs the published size;
``configs/retrieval/bigbird.py:tiny`` is the CPU size. Settings: ``configs/lra.py``.
"""

from configs import lra


def get_config(variant=None):
  """Attention ``bigbird`` on task ``retrieval``; ``variant`` in ``lra.task_variants("retrieval")``."""
  return lra.make_config("retrieval", "bigbird", variant)
