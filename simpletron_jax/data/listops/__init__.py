"""ListOps (LRA's ``listops``): a seeded generator, the label evaluator and the TSV reader.

:mod:`.tokens` holds the fixed vocabulary, LRA's tokenisation and the evaluator that gives an
expression its label; :mod:`.trees` LRA's tree algorithm; :mod:`.generate` draws expressions
with it, seeded, and writes them in LRA's TSV layout; :mod:`.read` reads that layout (or LRA's
release); :mod:`.task` registers the task's record and data command. Their public names are
importable from here.
"""

from simpletron_jax.data.listops.generate import (ensure_generated,  # noqa: F401
                                                  generate_dataset, generate_splits, write_tsv)
from simpletron_jax.data.listops.read import load_split  # noqa: F401
from simpletron_jax.data.listops.tokens import (END, NUM_CLASSES, OPERATORS,  # noqa: F401
                                                PAD_ID, VOCAB, VOCAB_SIZE, evaluate, tokenize)
from simpletron_jax.data.listops.task import generator_args  # noqa: F401
from simpletron_jax.data.listops.trees import (generate_tree, sample_token_ids,  # noqa: F401
                                               to_source, to_string)
