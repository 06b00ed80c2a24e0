"""Tabulates the runs in a folder against the published LRA and SimpleTRON numbers.

Usage::

    python scripts/compare.py results/listops_tiny_authors [--out DIR]

Every folder under the argument that holds ``results.json`` and ``config.json`` is a run;
``seed<N>`` folders are grouped by their parent (the layout ``scripts/seeds.py`` writes).
For each group the table gives the test accuracy under both protocols (best-validation
checkpoint and final step: mean ± sample std / best seed), the published number for the
same attention and task (``simpletron_jax/published.py``), our number under the protocol
the publication used, and the gap in points. Writes ``comparison.md`` and
``comparison.png`` (a bar chart) in ``--out`` (default: the folder itself) and prints the
table.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from simpletron_jax import reporting  # noqa: E402  pylint: disable=wrong-import-position

NOTE = ("Published: LRA's Table 1 (one run, latest checkpoint) is compared with our mean "
        "final-step accuracy; the SimpleTRON paper (best of 5 seeds, best-validation "
        "checkpoint) with our best seed's best-validation accuracy. Gap = ours - published, "
        "in points. A published number was obtained at the paper's model size and length; "
        "a run of another size or length is not comparable with it.")


def main(argv: Sequence[str] | None = None) -> str:
  """Parses the flags, writes comparison.md and comparison.png, returns the markdown."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("folder", help="a folder of runs (searched recursively)")
  parser.add_argument("--out", default=None, help="output folder; default: the folder")
  args = parser.parse_args(argv)
  rows = reporting.comparison_rows(reporting.find_runs(args.folder))
  out = args.out or args.folder
  os.makedirs(out, exist_ok=True)
  text = reporting.comparison_markdown(rows) + "\n" + NOTE + "\n"
  with open(os.path.join(out, "comparison.md"), "w") as f:
    f.write(text)
  reporting.comparison_chart(rows, os.path.join(out, "comparison.png"))
  print(text)
  return text


if __name__ == "__main__":
  main()
