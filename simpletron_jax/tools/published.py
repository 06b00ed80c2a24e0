"""The published accuracies, under the name ``simpletron_jax.tools.reporting`` and
``scripts/compare.py`` import: :mod:`simpletron_jax.experiments.published` (the record and its
sources)."""

from simpletron_jax.experiments.published import (CELLS, PROTOCOLS, PUBLISHED, REFERENCES,
                                                  Published, Reference, lookup, references)

__all__ = ["CELLS", "PROTOCOLS", "PUBLISHED", "REFERENCES", "Published", "Reference", "lookup",
           "references"]
