"""Pathfinder generators against the original: statistics, a picture grid and the speed.

    python benchmarks/pathfinder_generators.py --original /tmp/pathfinder_original \
        --out benchmarks/results/cpu/pathfinder_generators

``--original`` holds images of the original generator (``drewlinsley/pathfinder``'s
``snakes2.py``, run out of tree with LRA's settings) in LRA's layout,
``pathfinder{32,128}/{curv_baseline,curv_contour_length_9,curv_contour_length_14}/``, each
level with the trace of its drawing (``orig_trace.jsonl``, see
:func:`simpletron_jax.data.pathfinder.stats.read_original`). For every level found there,
this script draws as many images with this project's ``dashed`` generator (the default) and
with its ``solid`` one (indices ``0..n-1`` of ``--seed``), and writes ``<out>.json`` (every
statistic of :func:`~simpletron_jax.data.pathfinder.stats.summarize`), ``<out>.md`` (the
table) and ``<out>.png`` (original, dashed and solid images side by side). With
``--speed_images N`` it also times ``generate_dataset`` on N Path-X hard images with
``--workers`` processes and projects the time of a 200,000-image level.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from simpletron_jax.data import pathfinder as pf  # noqa: E402
from simpletron_jax.data.pathfinder import stats  # noqa: E402
from simpletron_jax.runtime import cli  # noqa: E402

PATHX_IMAGES = 200000
"""Images per Path-X level in LRA's release (``Pathfinder128``)."""
ORIGINAL_RUN = (
    "The original: `snakes.py` and `snakes2.py` of `drewlinsley/pathfinder` at commit ab9c130 "
    "(2019, the code LRA used), run out of tree (never committed here) on Python 3.11 with "
    "NumPy 2.4 (its `np.float` and `np.round_` aliases restored), OpenCV 5.0 and Pillow 13, "
    "with `scipy.misc.imresize` and `imsave` re-created as SciPy 1.1 had them (scale to uint8 "
    "between the minimum and maximum, then PIL's Lanczos resize or PNG save; the upstream "
    "2026 port to PIL alone resizes float images instead, which shrinks the markers 255-fold "
    "and cannot save the PNG). Settings: `snakes2_wrapper.py`'s (`use_single_paddles=False`, "
    "`max_paddle_retrial=2`, `max_distractor_contour_retrial=4`, `paddle_length=5`) with the "
    "changes listed in `lra_benchmarks/data/pathfinder.py` (`Pathfinder32`, `Pathfinder128`), "
    "distractor counts with integer division. Every kept paddle, marker and `two_snakes` call "
    "was recorded by wrapping the original's functions (`orig_trace.jsonl`).")


def ours(generator: str, resolution: int, level: str, seed: int,
         n: int) -> list[stats.ImageRecord]:
  """Images ``0..n-1`` of one of this project's generators, as records."""
  params = pf.level_params(generator, resolution, level)
  return [stats.record_from_info(*pf.render_indexed(generator, seed, params, i))
          for i in range(n)]


def compare_level(original_dir: str, resolution: int, level: str, seed: int) -> dict:
  """Statistics of the original, dashed and solid images of one level, and their distances.

  Returns:
    ``{"original", "dashed", "solid"}`` -> :func:`stats.summarize`, plus ``"tvd"``: the total
    variation between the dashed and the original gap and turn histograms.
  """
  original = stats.read_original(original_dir)
  out = {"original": stats.summarize(original)}
  for generator in ("dashed", "solid"):
    out[generator] = stats.summarize(ours(generator, resolution, level, seed, len(original)))
  out["tvd"] = {key: round(stats.total_variation(out["original"][key], out["dashed"][key]), 4)
                for key in ("gap_hist", "turn_hist")}
  out["samples"] = {"original": original[:4]}
  return out


def measure_speed(num_images: int, workers: int, seed: int) -> dict:
  """Times ``generate_dataset`` (dashed, 128 x 128, hard) with ``workers`` processes.

  Returns:
    Wall-clock and CPU images per second, and the projected hours of a 200,000-image level on
    2 and 16 cores (CPU rate times cores, as the workers share nothing).
  """
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  own = time.process_time()
  with tempfile.TemporaryDirectory() as folder:
    result = pf.generate_dataset(folder, seed=seed, resolution=128, level="hard",
                                 num_images=num_images, num_workers=workers, progress=False)
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
         + time.process_time() - own)
  per_core = num_images / cpu
  return {"num_images": num_images, "workers": workers, "wall_seconds": result["seconds"],
          "images_per_second_wall": result["images_per_second"],
          "cpu_seconds": round(cpu, 1), "images_per_cpu_second": round(per_core, 2),
          "mean_attempts": round(result["mean_attempts"], 1),
          "hours_200k_2_cores_at_measured_wall": round(
              PATHX_IMAGES / result["images_per_second"] * workers / 2 / 3600, 2),
          "hours_200k_2_cores": round(PATHX_IMAGES / (2 * per_core) / 3600, 2),
          "hours_200k_16_cores": round(PATHX_IMAGES / (16 * per_core) / 3600, 2),
          "load_average_before": None}


def _hist_text(values) -> str:
  return " ".join(f"{100 * v:.0f}" for v in values) if values else "n/a"


def markdown(table: dict, speed: dict | None, command: str) -> str:
  """The committed table: one block of rows per level."""
  lines = [f"Command: `{command}`", "", ORIGINAL_RUN, "",
           "`dashed`: `simpletron_jax/data/pathfinder/dashed.py` (the default); `solid`: "
           "`simpletron_jax/data/pathfinder/draw.py`. Same count per level; ours are images "
           "0..n-1 of seed 0.", "",
           "Columns: lit = share of pixels above 0; paddles per image; gap = pixels from a "
           "paddle's end to the next one's start (mean, TVD of its histogram against the "
           "original's); turn = degrees between consecutive paddles (mean, TVD); marker "
           "distance (pixels) for label 0 / 1; CC = share of labels a connected-component "
           "labelling (8-connected, pixels > 0) gets right; attempts = drawings of the two "
           "target contours per image (both generators redraw them until they fit).", "",
           "| level | generator | n | lit % | paddles | gap mean (TVD) | turn mean (TVD) | "
           "marker dist. 0 / 1 | CC acc. % | attempts |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for key, level in table.items():
    for name in ("original", "dashed", "solid"):
      s = level[name]
      tvd = level["tvd"] if name == "dashed" else None
      gap = "none (joined)" if s["gap_mean"] is None else (
          f"{s['gap_mean']:.2f}" + (f" ({tvd['gap_hist']:.3f})" if tvd else ""))
      turn = "n/a" if s["turn_mean"] is None else (
          f"{s['turn_mean']:.1f}" + (f" ({tvd['turn_hist']:.3f})" if tvd else ""))
      attempts = "n/a" if s["attempts_mean"] is None else f"{s['attempts_mean']:.0f}"
      md = s["marker_distance"]
      lines.append(f"| {key} | {name} | {s['n']} | {100 * s['lit_fraction']:.1f} | "
                   f"{s['paddles']:.1f} | {gap} | {turn} | {md['0']:.1f} / {md['1']:.1f} | "
                   f"{100 * s['cc_accuracy']:.1f} | {attempts} |")
  lines += ["", "Gap and turn histograms (% per bin; gap bins 0-1, 1-2, ..., 7-8, 8+ pixels; "
            "turn bins 0-10, ..., 80-90, 90+ degrees):", "",
            "| level | generator | gap histogram | turn histogram |", "|---|---|---|---|"]
  for key, level in table.items():
    for name in ("original", "dashed"):
      lines.append(f"| {key} | {name} | {_hist_text(level[name]['gap_hist'])} | "
                   f"{_hist_text(level[name]['turn_hist'])} |")
  if speed:
    lines += ["", f"Speed (dashed, Path-X hard, `generate_dataset` with {speed['workers']} "
              f"worker processes, {speed['num_images']} images, on this loaded 2-core machine): "
              f"{speed['images_per_second_wall']} images/s wall-clock "
              f"({speed['wall_seconds']:.0f} s), {speed['images_per_cpu_second']} images per "
              f"CPU-second per core ({speed['mean_attempts']:.0f} target drawings per image). "
              f"A 200,000-image Path-X level: {speed['hours_200k_2_cores_at_measured_wall']} h "
              f"at the measured wall-clock rate on 2 cores, {speed['hours_200k_2_cores']} h on "
              f"2 free cores and {speed['hours_200k_16_cores']} h on 16, from the CPU rate "
              f"(workers share nothing)."]
  return "\n".join(lines) + "\n"


def picture(table: dict, seed: int, path: str) -> None:
  """A grid: one row per level, 4 original, 4 dashed and 4 solid images, labelled."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  rows, cols = len(table), 12
  fig, axes = plt.subplots(rows, cols, figsize=(cols * 1.2, rows * 1.35), squeeze=False)
  for r, (key, level) in enumerate(table.items()):
    resolution, name = key.split("/")
    resolution = int(resolution)
    shown = [("original", rec) for rec in level["samples"]["original"]]
    for generator in ("dashed", "solid"):
      shown += [(generator, rec) for rec in ours(generator, resolution, name, seed, 4)]
    for c, (who, rec) in enumerate(shown):
      ax = axes[r][c]
      ax.imshow(rec.image, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
      ax.set_xticks([])
      ax.set_yticks([])
      ax.set_title(f"{who} y={rec.label}", fontsize=6)
      if c == 0:
        ax.set_ylabel(key, fontsize=7)
  fig.suptitle("Pathfinder: original (drewlinsley/pathfinder) | dashed (default) | solid",
               fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main() -> None:
  """Command line; see the module docstring."""
  parser = cli.ArgumentParser(prog="pathfinder_generators.py",
                              description=__doc__.split("\n", maxsplit=1)[0])
  parser.add_argument("--original", required=True,
                      help="root with pathfinder{32,128}/<level>/ of the original's images")
  parser.add_argument("--out", default="runs/benchmarks/cpu/pathfinder_generators",
                      help="output path without extension (the committed one: "
                      "benchmarks/results/cpu/pathfinder_generators)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--speed_images", type=int, default=0,
                      help="time generate_dataset on this many Path-X hard images (0: skip)")
  parser.add_argument("--workers", type=int, default=2)
  args = parser.parse_args()
  table = {}
  for resolution in pf.RESOLUTIONS:
    for level, folder in pf.LEVELS.items():
      level_dir = os.path.join(args.original, f"pathfinder{resolution}", folder)
      if not os.path.isfile(os.path.join(level_dir, stats.TRACE_FILE)):
        print(f"skipping {level_dir}: no {stats.TRACE_FILE}")
        continue
      print(f"{resolution} {level} ...", flush=True)
      table[f"{resolution}/{level}"] = compare_level(level_dir, resolution, level, args.seed)
  if not table:
    raise SystemExit(f"no level with {stats.TRACE_FILE} under {args.original}")
  speed = None
  if args.speed_images:
    load = os.getloadavg()[0]
    speed = measure_speed(args.speed_images, args.workers, args.seed)
    speed["load_average_before"] = round(load, 1)
  command = "python benchmarks/pathfinder_generators.py " + " ".join(sys.argv[1:])
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  picture(table, args.seed, args.out + ".png")
  for level in table.values():
    del level["samples"]
  with open(args.out + ".json", "w", encoding="utf-8") as f:
    json.dump({"command": command, "original_run": ORIGINAL_RUN, "seed": args.seed,
               "machine": platform.machine(),
               "cpus": os.cpu_count(), "levels": table, "speed": speed}, f, indent=1)
    f.write("\n")
  with open(args.out + ".md", "w", encoding="utf-8") as f:
    f.write(markdown(table, speed, command))
  print(markdown(table, speed, command))


if __name__ == "__main__":
  main()
