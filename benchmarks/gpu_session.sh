#!/usr/bin/env bash
# GPU measurements of the benchmark tables, one part per device call (each fits the 10-minute
# limit). The speed options and ListOps in train.py are benchmarks/options_call.sh's.
#
# Prepare once, on the development machine, from the project root: the wheels the GPU machine
# lacks (ml_collections, grain, clu and their needs) in .whl/, with a .whl/setup.sh that
# installs them into .site/. Then each device call (carry [".whl"]) runs:
#   bash .whl/setup.sh && export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1 && \
#     bash benchmarks/gpu_session.sh <part>
# Parts:
#   check     flash == einsum softmax (bfloat16 tolerance, padding; tests/test_fast_paths.py on
#             the GPU), the profile of simple and softmax_flash at 4K (bfloat16), and
#             last_block_cls_only on/off for simple at 4K and 16K   (7 minutes on an H100)
#   bf16      the benchmark table, bfloat16, 1K..32K, every variant       (stops at 9 minutes)
#   fp32      the same in float32                                          (stops at 9 minutes)
#   profiles  simple's profile at 4K with the op behind each kernel, with and without
#             length_multiple=8; the profile of softmax_flash on cuDNN  (estimated at 3 minutes)
#   torch     PyTorch's speed on the same model and batch (benchmarks/torch_step.py: SDPA
#             softmax and simple, eager and torch.compile, 1K/4K/16K) beside the JAX rows
#             softmax_flash and simple measured just before in the same call, with the ratios
#                                                                  (estimated at 7 minutes)
# A part stopped by its time limit resumes where it stopped when called again (--resume) on
# the same warm machine. On a fresh machine, put the speed_memory.partial.jsonl it returned
# in .bench_resume/<dtype>.jsonl (bfloat16 or float32; .gitignore keeps the folder out) and
# carry [".whl", ".bench_resume"]. A benchmark cell took 12 to 46 s uncached on an H100,
# mostly compiling, so the bf16 table needs several calls.
# Everything is written under $OUT (default /tmp/gpu_session): at most 8 files per part, as
# the device tool returns them; each part also packs its folder into <part>.tar.gz.
set -uo pipefail
part=${1:?usage: bash benchmarks/gpu_session.sh check|profiles|torch|bf16|fp32}
OUT=${OUT:-/tmp/gpu_session}
work=/tmp/gpu_session_work/$part
mkdir -p "$OUT" "$work"
export JAX_PLATFORMS=cuda                 # tests/conftest.py would otherwise pick the CPU
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.9
log="$OUT/$part.log"
{ echo "== $(date -u +%FT%TZ) part $part"; nvidia-smi --query-gpu=name,memory.total,driver_version \
    --format=csv; python -c "import jax; print('jax', jax.__version__, jax.devices())"; } >"$log" 2>&1

bench() {  # bench <dtype> <seconds>
  # 1K, 4K, 16K and 32K (LRA's Table 2 lengths 2K and 3K, and 8K, left out: one-by-one
  # compiling fit about 40 cells in a session's device time, at 12 to 46 s each). A length's
  # cells now compile side by side in 8 threads of the machine's 16 cores, before they run
  # (speed from this on a GPU not yet measured: compare the log's compile lines and each
  # cell's prepare_wall_s with the one-by-one figures above, and the simple and softmax_flash
  # rows with speed_memory_core_cells.jsonl). A slow cell's timed runs are cut to about 2 s
  # each (--run_seconds). Cells measured by an earlier call on another machine are reused if
  # their partial file was carried in as .bench_resume/<dtype>.jsonl.
  mkdir -p "$work/$1"
  if [ -f ".bench_resume/$1.jsonl" ] && [ ! -f "$work/$1/speed_memory.partial.jsonl" ]; then
    cp ".bench_resume/$1.jsonl" "$work/$1/speed_memory.partial.jsonl"
  fi
  timeout "$2" python benchmarks/speed_memory.py --dtype "$1" --lengths 1024 4096 16384 32768 \
    --out "$work/$1" --resume --cache_dir /tmp/jax_cache --compile_workers 8 --run_seconds 2 \
    >"$work/$1.log" 2>&1
  echo "speed_memory exit $? (124 = stopped by the time limit; call the part again)" >>"$log"
  tail -c 300000 "$work/$1.log" >>"$log"
  cp "$work/$1"/speed_memory.{json,md,png} "$OUT"/ 2>/dev/null
  cp "$work/$1"/speed_memory.partial.jsonl "$OUT"/ 2>/dev/null
}

case "$part" in
  check)
    # float32 equivalence tests compare full-precision matmuls (GPUs may use TF32 otherwise).
    JAX_DEFAULT_MATMUL_PRECISION=highest python -m pytest tests/test_fast_paths.py -q -rs \
      -p no:cacheprovider >"$OUT/test_fast_paths.txt" 2>&1
    echo "pytest exit $?" >>"$OUT/test_fast_paths.txt"
    for v in simple softmax_flash; do
      python benchmarks/profile_step.py --variant $v --length 4096 --dtype bfloat16 \
        --out "$work/profile_$v" >>"$log" 2>&1
      cp "$work/profile_$v/profile_summary.txt" "$OUT/profile_${v}_4k_bf16.txt"
    done
    for flag in false true; do
      python benchmarks/speed_memory.py --dtype bfloat16 --variants simple softmax_flash \
        --lengths 4096 16384 --set last_block_cls_only=$flag --out "$work/cls_$flag" \
        --cache_dir /tmp/jax_cache >>"$log" 2>&1
      cp "$work/cls_$flag/speed_memory.md" "$OUT/cls_only_${flag}.md"
    done
    ;;
  bf16) bench bfloat16 540 ;;
  fp32) bench float32 540 ;;
  profiles)
    # simple's profile again, now with the JAX op behind each kernel (where do the copies and
    # transposes come from?), as it is and with length_multiple=8.
    for set in "dropout_rate=0.1" "length_multiple=8"; do
      JAX_COMPILATION_CACHE_DIR=/tmp/jax_cache python benchmarks/profile_step.py --variant simple \
        --length 4096 --dtype bfloat16 --set "$set" --top 40 --out "$work/profile_simple_$set" \
        >>"$log" 2>&1
      cat "$work/profile_simple_$set/profile_summary.txt" >>"$OUT/profile_simple_sources.txt"
    done
    # Then softmax_flash on cuDNN.
    JAX_COMPILATION_CACHE_DIR=/tmp/jax_cache python benchmarks/profile_step.py \
      --variant softmax_flash --length 4096 --dtype bfloat16 --out "$work/profile_softmax_flash" \
      >>"$log" 2>&1
    cp "$work/profile_softmax_flash/profile_summary.txt" "$OUT/profile_softmax_flash_4k_bf16.txt"
    ;;
  torch)
    # The JAX rows first (their own process, which frees the GPU when it exits), then PyTorch.
    # torch_step rewrites its outputs after every cell, so a run stopped by its limit keeps them.
    timeout 200 python benchmarks/speed_memory.py --dtype bfloat16 --variants softmax_flash simple \
      --lengths 1024 4096 16384 --out "$work/jax" --cache_dir /tmp/jax_cache --compile_workers 8 \
      --run_seconds 2 >>"$log" 2>&1
    echo "speed_memory exit $?" >>"$log"
    jax_results=()
    [ -f "$work/jax/speed_memory.json" ] && jax_results=(--jax_results "$work/jax/speed_memory.json")
    timeout 330 python benchmarks/torch_step.py --dtype bfloat16 --lengths 1024 4096 16384 \
      --run_seconds 2 "${jax_results[@]}" --out "$work/torch" >>"$log" 2>&1
    echo "torch_step exit $? (124 = stopped by the time limit)" >>"$log"
    cp "$work/jax/speed_memory.md" "$OUT/torch_part_jax_rows.md" 2>/dev/null
    cp "$work/torch"/torch_step.{json,md} "$OUT"/ 2>/dev/null
    ;;
  *) echo "unknown part $part" >&2; exit 2 ;;
esac
# Without traces and the ListOps runs' checkpoints (hundreds of MB, over the 16 MiB a file).
tar -czf "$OUT/$part.tar.gz" --exclude=trace --exclude=checkpoints --exclude=best \
  -C "$work/.." "$part" 2>/dev/null
echo "== done $(date -u +%FT%TZ)" >>"$log"
