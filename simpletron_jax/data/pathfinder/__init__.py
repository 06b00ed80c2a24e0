"""Pathfinder (Linsley et al., 2018; LRA's Pathfinder and Path-X): seeded generators and a reader.

An image shows curved contours on a black background and two round markers; the label is 1
when one contour joins the markers. :mod:`.params` holds the levels and LRA's settings.
:mod:`.dashed` draws an image as LRA's data was drawn (the algorithm of ``drewlinsley/pathfinder``,
contours of separate paddles; ``data.generator="dashed"``, the default; its paddles and
candidate pixels per setting in :mod:`.dashed_geometry`), :mod:`.draw` the ``solid`` option
(connected paths whose label a connected-component labelling reads off; its masks in
:mod:`.draw_masks`).
:mod:`.generate` writes a level in LRA's file layout, :mod:`.read` reads that layout (or LRA's
release) and splits it, and :mod:`.stats` measures a set of images (the comparison with the
original generator in ``benchmarks/pathfinder_generators.py``); :mod:`.task` registers the
``pathfinder`` and ``pathx`` records and their data command. Their public names are
importable from here.
"""

from simpletron_jax.data.pathfinder.dashed import (dashed_example_rng,  # noqa: F401
                                                   render_dashed, render_dashed_info)
from simpletron_jax.data.pathfinder.draw import (example_rng, render_example,  # noqa: F401
                                                 render_example_info)
from simpletron_jax.data.pathfinder.generate import (IMAGES_PER_SHARD,  # noqa: F401
                                                     ensure_generated, generate_dataset,
                                                     level_params, render_indexed)
from simpletron_jax.data.pathfinder.params import (CONTOUR_LENGTHS, GENERATORS,  # noqa: F401
                                                   LEVELS, NUM_CLASSES, RESOLUTIONS,
                                                   VOCAB_SIZE, DashedParams, PathfinderParams,
                                                   check_generator, dashed_params_for,
                                                   params_for)
from simpletron_jax.data.pathfinder.read import (SPLIT_HASHES, find_level_dir,  # noqa: F401
                                                 load_pathfinder, lra_example_key, lra_hash,
                                                 lra_order, lra_split_bounds, read_metadata)
from simpletron_jax.data.pathfinder.task import generator_args  # noqa: F401
