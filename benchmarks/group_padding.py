"""Share of padded tokens in training batches, with and without ``data.group_by_length``.

    python benchmarks/group_padding.py --data_dir ~/.cache/simpletron_jax/listops/<folder>

Reads a ListOps training split in LRA's layout (``basic_train.tsv``) and reports, for one
epoch of ``--batch``-example batches, the padded share of all tokens when each batch is padded
to ``max_length`` (LRA), to its longest example rounded up to ``--bucket`` (this project's
default), and the same after grouping by length in pools of ``--pool`` batches
(:mod:`simpletron_jax.data.grouping`). Step time grows with the padded length, so one minus
the ratio of padded tokens is the work saved. A CPU measurement: no model runs.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from simpletron_jax.data import grouping, listops  # noqa: E402
from simpletron_jax.runtime import cli  # noqa: E402


def padding_table(lengths: np.ndarray, batch: int, max_length: int, bucket: int, pool: int,
                  seed: int = 0) -> dict[str, float]:
  """Padded share and padded tokens per example for the three orders of one epoch.

  Returns:
    ``{"<order> padded_share", "<order> tokens_per_example"}`` for ``lra`` (pad to
    max_length), ``bucketed`` and ``grouped``.
  """
  n_batches = len(lengths) // batch
  plain = np.random.default_rng(seed).permutation(len(lengths))[:n_batches * batch]
  plain = plain.reshape(n_batches, batch)
  stream = grouping.GroupedBatches(lengths, seed, batch, pool)
  grouped = [stream[i] for i in range(n_batches)]
  out = {}
  for name, batches, b in (("lra", plain, 0), ("bucketed", plain, bucket),
                           ("grouped", grouped, bucket)):
    share = grouping.padding_fraction(lengths, batches, max_length, b)
    real = np.minimum(lengths[np.concatenate(list(batches))], max_length).mean()
    out[f"{name} padded_share"] = share
    out[f"{name} tokens_per_example"] = real / (1.0 - share)
  return out


def main() -> None:
  """Command line: counts the padded share of tokens for each batching; see the module docstring."""
  parser = cli.ArgumentParser(prog="group_padding.py",
                              description=__doc__.split("\n", maxsplit=1)[0])
  parser.add_argument("--data_dir", required=True, help="folder with basic_train.tsv")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--max_length", type=int, default=2000)
  parser.add_argument("--bucket", type=int, default=128)
  parser.add_argument("--pool", type=int, default=50, help="data.group_pool_batches")
  parser.add_argument("--out", default=None,
                      help="write the table as <out>.json and <out>.md (e.g. "
                      "benchmarks/results/cpu/group_padding)")
  args = parser.parse_args()
  lengths = listops.load_split(args.data_dir, "train").lengths
  print(f"{len(lengths)} examples, mean length {lengths.mean():.0f}, batch {args.batch}, "
        f"max_length {args.max_length}, bucket {args.bucket}, pool {args.pool} batches")
  table = padding_table(lengths, args.batch, args.max_length, args.bucket, args.pool)
  header = (f"{len(lengths)} examples, mean length {lengths.mean():.0f}, batch {args.batch}, "
            f"max_length {args.max_length}, bucket {args.bucket}, pool {args.pool} batches")
  rows = ["| order | padded share | padded tokens per example |", "|---|---|---|"]
  for name in ("lra", "bucketed", "grouped"):
    rows.append(f"| {name} | {100 * table[name + ' padded_share']:.1f}% | "
                f"{table[name + ' tokens_per_example']:.0f} |")
  print("\n".join(rows))
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".json", "w") as f:
      json.dump({"settings": vars(args), "num_examples": int(len(lengths)),
                 "mean_length": float(lengths.mean()), **table}, f, indent=2)
    with open(args.out + ".md", "w") as f:
      f.write(f"`{' '.join(sys.argv)}`\n\n{header}\n\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
  main()
