"""Data for the tasks: ragged example storage, batching, each task's reader and data command.

Importing the package registers every task's record (:mod:`simpletron_jax.data.tasks`), each
from its own module, in the order of LRA's Table 1, then AG News.
"""

# pylint: disable-next=wrong-import-order
from simpletron_jax.data import listops, text, retrieval, image, pathfinder, agnews  # noqa: F401
