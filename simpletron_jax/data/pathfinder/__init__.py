"""Pathfinder (Linsley et al., 2018; LRA's Pathfinder and Path-X): a seeded generator and a reader.

An image shows a few curved paths on a black background and two round markers; the label is 1
when one path joins the markers. :mod:`.params` holds the levels and LRA's settings,
:mod:`.draw` draws one image, :mod:`.generate` writes a level in LRA's file layout, and
:mod:`.read` reads that layout (or LRA's release) and splits it. Their public names are
importable from here.
"""

from simpletron_jax.data.pathfinder.draw import (example_rng, render_example,  # noqa: F401
                                                 render_example_info)
from simpletron_jax.data.pathfinder.generate import (IMAGES_PER_SHARD,  # noqa: F401
                                                     ensure_generated, generate_dataset)
from simpletron_jax.data.pathfinder.params import (CONTOUR_LENGTHS, LEVELS,  # noqa: F401
                                                   NUM_CLASSES, RESOLUTIONS, VOCAB_SIZE,
                                                   PathfinderParams, params_for)
from simpletron_jax.data.pathfinder.read import (SPLIT_HASHES, find_level_dir,  # noqa: F401
                                                 load_pathfinder, lra_example_key, lra_hash,
                                                 lra_order, lra_split_bounds, read_metadata)
