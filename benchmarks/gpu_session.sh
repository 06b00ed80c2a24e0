#!/usr/bin/env bash
# Issue 10's GPU measurements, one part per device call (each part fits the 10-minute limit).
#
# Prepare once, on the development machine, from the project root:
#   bash ../shared/tools/device-prep.sh --no-cifar     # wheels into .whl/ (ml_collections, grain, ...)
# Then each device call (carry [".whl"]) runs:
#   bash .whl/setup.sh && export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1 && \
#     bash benchmarks/gpu_session.sh <part>
# Parts:
#   check     flash == einsum softmax (bfloat16 tolerance, padding; tests/test_fast_paths.py on
#             the GPU), the profile of simple and softmax_flash at 4K (bfloat16), the attention
#             op alone with Simple's layout candidates and the dropout-mask candidates
#             (attention_op.py, 1K/4K/16K), and last_block_cls_only on/off for simple at 4K
#             and 16K                                      (7 minutes on an H100, 2026-11-23)
#   bf16      the benchmark table, bfloat16, 1K..32K, every variant       (stops at 9 minutes)
#   fp32      the same in float32                                          (stops at 9 minutes)
#   leads     the pads XLA puts before matmuls at L + 1 = 4096, 4097 and 4097 -> 4104
#             (hlo_pads.py); simple at 4K with and without dropout, and at L + 1 = 4096 against
#             4097; simple at 4K with model.dropout_mask_bits=16, and at 4K and 16K with
#             attention_kwargs.heads_first; simple and softmax_flash at 4K and 16K with
#             model.length_multiple=8 (JSONs in leads.tar.gz)       (estimated at 7 minutes)
#   layouts   simple at 4K and 16K as it is, with attention_kwargs.heads_first, with
#             attention_kwargs.block_diagonal, and with block_diagonal + last_block_cls_only +
#             length_multiple=8; softmax_flash with flat projections + last_block_cls_only +
#             length_multiple=8; hlo_cost.py on this GPU's compile; the profile of
#             simple's three-option step                          (estimated at 7 minutes)
#   profiles  simple's profile at 4K with the op behind each kernel, with and without
#             length_multiple=8; the profile of softmax_flash on cuDNN  (estimated at 3 minutes)
#   torch     PyTorch's speed on the same model and batch (benchmarks/torch_step.py: SDPA
#             softmax and simple, eager and torch.compile, 1K/4K/16K) beside the JAX rows
#             softmax_flash and simple measured just before in the same call, with the ratios
#                                                                  (estimated at 7 minutes)
#   listops_fast  (after listops, same machine) the grouped ListOps run with
#             attention_kwargs.block_diagonal, last_block_cls_only and length_multiple=8
#                                                              (estimated at 5 minutes)
#   listops   train.py's loop on the ListOps paper config in bfloat16: generation (10 s with
#             14 workers), then 300 steps without and with data.group_by_length. Every padded
#             length compiles its own step (simple: 9 to 14 s each): the ungrouped run compiles
#             them in the loop, the grouped one before it (--precompile_workers=8);
#             each metrics.jsonl train window has compile_seconds, new_shapes and
#             steps_per_sec_excluding_compile (the steady-state rate), and results.json the
#             run's train_compile_seconds_this_run.
# A part stopped by its time limit resumes where it stopped when called again (--resume) on
# the same warm machine. On a fresh machine, put the speed_memory.partial.jsonl it returned
# in .bench_resume/<dtype>.jsonl (bfloat16 or float32; .gitignore keeps the folder out) and
# carry [".whl", ".bench_resume"].
# Measured on 2026-11-23 (benchmarks/results/nvidia-h100-80gb-hbm3/README.md): check is done
# (rerun its test after changing a fast path); a benchmark cell takes 12 to 46 s uncached,
# mostly compiling and setting up, so the bf16 table needs several calls (cells now compile 8
# side by side, not yet measured on a GPU). Next order: layouts, listops, listops_fast,
# torch, leads, profiles, bf16 (resumed), fp32.
# Chain the calls: the machine is handed back 30 s after a call ends, and a fresh one starts
# bare (no compilation cache, no generated ListOps). Logs of the long steps are cut to their
# tails, because the device tool returns no file over 16 MiB.
# Everything is written under $OUT (default /tmp/gpu_session): at most 8 files per part, as
# the device tool returns them; each part also packs its folder into <part>.tar.gz.
set -uo pipefail
part=${1:?usage: bash benchmarks/gpu_session.sh check|layouts|leads|profiles|torch|bf16|fp32|listops|listops_fast}
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
  # each (--run-seconds). Cells measured by an earlier call on another machine are reused if
  # their partial file was carried in as .bench_resume/<dtype>.jsonl.
  mkdir -p "$work/$1"
  if [ -f ".bench_resume/$1.jsonl" ] && [ ! -f "$work/$1/speed_memory.partial.jsonl" ]; then
    cp ".bench_resume/$1.jsonl" "$work/$1/speed_memory.partial.jsonl"
  fi
  timeout "$2" python benchmarks/speed_memory.py --dtype "$1" --lengths 1024 4096 16384 32768 \
    --out "$work/$1" --resume --cache-dir /tmp/jax_cache --compile-workers 8 --run-seconds 2 \
    >"$work/$1.log" 2>&1
  echo "speed_memory exit $? (124 = stopped by the time limit; call the part again)" >>"$log"
  tail -c 300000 "$work/$1.log" >>"$log"
  cp "$work/$1"/speed_memory.{json,md,png} "$OUT"/ 2>/dev/null
  cp "$work/$1"/speed_memory.partial.jsonl "$OUT"/ 2>/dev/null
}

listops_loop() {  # listops_loop <steps> <seconds ungrouped> <seconds grouped>
  # python -c, not a script on stdin: the generator's spawned workers re-import __main__, and a
  # '<stdin>' main cannot be imported.
  timeout 120 python -c 'from simpletron_jax.data import listops
listops.generate_dataset("/tmp/listops_lra", seed=0, num_workers=14)' >"$work/listops_gen.log" 2>&1
  echo "ListOps generation exit $?" >>"$log"; tail -c 2000 "$work/listops_gen.log" >>"$log"
  for grouped in False True; do
    # Ungrouped: each new bucket compiles in the loop (its compile_seconds in metrics.jsonl).
    # Grouped: all its buckets compiled first, 8 side by side, into a cache of its own.
    if [ $grouped = False ]; then limit=$2; pre=0; cache=/tmp/jax_cache
    else limit=$3; pre=8; cache=/tmp/jax_cache_grouped; fi
    timeout "$limit" python train.py --config configs/listops/simple.py \
      --config.model.dtype=bfloat16 --config.data.data_dir=/tmp/listops_lra \
      --config.num_train_steps="$1" --config.eval_frequency="$1" --config.checkpoint_every="$1" \
      --config.num_eval_steps=2 --config.num_test_steps=2 --config.data.group_by_length=$grouped \
      --xla_cache_dir=$cache --precompile_workers=$pre --workdir "$work/listops_grouped_$grouped" \
      >"$work/listops_$grouped.log" 2>&1
    echo "train.py grouped=$grouped exit $?" >>"$log"; tail -c 20000 "$work/listops_$grouped.log" >>"$log"
    cp "$work/listops_grouped_$grouped/metrics.jsonl" "$OUT/listops_grouped_${grouped}.jsonl"
  done
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
    python benchmarks/attention_op.py --dtype bfloat16 --out "$work/attention_op" \
      --cache-dir /tmp/jax_cache >>"$log" 2>&1
    cp "$work/attention_op/attention_op.md" "$OUT/attention_op_bf16.md"
    for flag in false true; do
      python benchmarks/speed_memory.py --dtype bfloat16 --variants simple softmax_flash \
        --lengths 4096 16384 --set last_block_cls_only=$flag --out "$work/cls_$flag" \
        --cache-dir /tmp/jax_cache >>"$log" 2>&1
      cp "$work/cls_$flag/speed_memory.md" "$OUT/cls_only_${flag}.md"
    done
    ;;
  bf16) bench bfloat16 540 ;;
  fp32) bench float32 540 ;;
  listops)
    listops_loop 300 180 300
    ;;
  listops_fast)
    # After listops on the same warm machine (its generated data in /tmp/listops_lra): the
    # grouped run again with the GPU options the model favours (benchmarks/hlo_cost.py:
    # 1.52x at L 2000), its buckets compiled first.
    [ -d /tmp/listops_lra ] || timeout 120 python -c 'from simpletron_jax.data import listops
listops.generate_dataset("/tmp/listops_lra", seed=0, num_workers=14)' >>"$log" 2>&1
    timeout 420 python train.py --config configs/listops/simple.py \
      --config.model.dtype=bfloat16 --config.data.data_dir=/tmp/listops_lra \
      --config.num_train_steps=300 --config.eval_frequency=300 --config.checkpoint_every=300 \
      --config.num_eval_steps=2 --config.num_test_steps=2 --config.data.group_by_length=True \
      --config.model.attention_kwargs.block_diagonal=True \
      --config.model.last_block_cls_only=True --config.model.length_multiple=8 \
      --xla_cache_dir=/tmp/jax_cache_fast --precompile_workers=8 \
      --workdir "$work/listops_fast" >"$work/listops_fast.log" 2>&1
    echo "train.py fast options exit $?" >>"$log"; tail -c 20000 "$work/listops_fast.log" >>"$log"
    cp "$work/listops_fast/metrics.jsonl" "$OUT/listops_fast.jsonl"
    ;;
  leads)
    # What the next speed-ups of simple's step would be worth: its dropout (rate 0.1 against
    # 0, same shapes) and the odd length L + 1 (4095 + CLS = 4096 against 4096 + CLS = 4097).
    # Each cell's phase_s is in the JSON (leads.tar.gz).
    # (File names without '=': the device tool returns only letters, digits, '.', '_', '-'.)
    # First, from the compiled HLO alone: does XLA pad the matmuls at the odd length 4097, and
    # not at 4096 or with length_multiple=8? (The programs land in the cache the runs below use.)
    python benchmarks/hlo_pads.py --variant simple --lengths 4095 4096 --dtype bfloat16 \
      --cache-dir /tmp/jax_cache --out "$work/hlo_pads" >>"$log" 2>&1
    python benchmarks/hlo_pads.py --variant simple --lengths 4096 --dtype bfloat16 \
      --set length_multiple=8 --cache-dir /tmp/jax_cache --out "$work/hlo_pads_m8" >>"$log" 2>&1
    cat "$work/hlo_pads/hlo_pads.md" "$work/hlo_pads_m8/hlo_pads.md" >"$OUT/leads_hlo_pads.md"
    for rate in 0.1 0.0; do
      python benchmarks/speed_memory.py --dtype bfloat16 --variants simple --lengths 4095 4096 \
        --set dropout_rate=$rate --out "$work/dropout_$rate" --cache-dir /tmp/jax_cache \
        >>"$log" 2>&1
      cp "$work/dropout_$rate/speed_memory.md" "$OUT/leads_dropout_$rate.md"
    done
    # 16-bit dropout masks in the full step (1.10x on CPU; the masks alone 0.85x on an H100),
    # and Simple's products on [B, H, L, K] (attention_kwargs.heads_first; 1.03x-1.06x on CPU):
    # compare with the 4096 row of leads_dropout_0.1.md and with cls_only_false.md.
    python benchmarks/speed_memory.py --dtype bfloat16 --variants simple --lengths 4096 \
      --set dropout_mask_bits=16 --out "$work/mask16" --cache-dir /tmp/jax_cache \
      >>"$log" 2>&1
    cp "$work/mask16/speed_memory.md" "$OUT/leads_mask16.md"
    python benchmarks/speed_memory.py --dtype bfloat16 --variants simple --lengths 4096 16384 \
      --set 'attention_kwargs={"heads_first": true}' --out "$work/heads_first" \
      --cache-dir /tmp/jax_cache --compile-workers 2 >>"$log" 2>&1
    cp "$work/heads_first/speed_memory.md" "$OUT/leads_heads_first.md"
    # The fix for the odd length, if it pays: 4097 positions padded to 4104 (16K: 16385 to
    # 16392) with masked positions; compare with the 4096 rows above and with cls_only_false.md.
    python benchmarks/speed_memory.py --dtype bfloat16 --variants simple softmax_flash \
      --lengths 4096 16384 --set length_multiple=8 --out "$work/multiple8" \
      --cache-dir /tmp/jax_cache --compile-workers 2 >>"$log" 2>&1
    cp "$work/multiple8/speed_memory.md" "$OUT/leads_multiple8.md"
    ;;
  layouts)
    # Simple's layouts in the full step, the default first in the same call: the model of
    # benchmarks/hlo_cost.py (compiled for an H100 without one,
    # benchmarks/results/nvidia-h100-80gb-hbm3/hlo_cost/) gives block_diagonal with
    # last_block_cls_only and length_multiple=8 1.71x at 4K, heads_first 1.26x. Then
    # softmax_flash with the options that apply to it too (the same flat projections, the
    # last block on CLS, the length padded to a multiple of 8), for a fair comparison.
    # All the tables go into one file (the device tool returns at most 8).
    bd='"block_diagonal":true'
    flash='"implementation":"flash","flat_projection":true'
    for spec in "simple:default:dropout_rate=0.1" \
        "simple:heads_first:attention_kwargs={\"heads_first\":true}" \
        "simple:block_diagonal:attention_kwargs={$bd}" \
        "simple:bd_cls_m8:attention_kwargs={$bd} last_block_cls_only=true length_multiple=8" \
        "softmax_flash:flash_cls_m8:attention_kwargs={$flash} last_block_cls_only=true length_multiple=8"; do
      variant=${spec%%:*}; rest=${spec#*:}; name=${rest%%:*}; read -r -a sets <<<"${rest#*:}"
      python benchmarks/speed_memory.py --dtype bfloat16 --variants "$variant" \
        --lengths 4096 16384 --set "${sets[@]}" --out "$work/$name" --cache-dir /tmp/jax_cache \
        --compile-workers 2 --run-seconds 2 >>"$log" 2>&1
      { echo "## $name ($variant, --set ${sets[*]})"; cat "$work/$name/speed_memory.md"; echo; } \
        >>"$OUT/layouts_tables.md" 2>&1
    done
    # The model on this GPU's own compile (autotuned), to set against the times above.
    python benchmarks/hlo_cost.py --target local --lengths 4096 --specs simple \
      "simple+attention_kwargs={$bd}+last_block_cls_only=true+length_multiple=8" \
      --bandwidth 2.68e12 --out "$work/hlo_cost" >>"$log" 2>&1
    cp "$work/hlo_cost/hlo_cost.md" "$OUT/layouts_hlo_cost_gpu.md"
    JAX_COMPILATION_CACHE_DIR=/tmp/jax_cache python benchmarks/profile_step.py --variant simple \
      --length 4096 --dtype bfloat16 --set "attention_kwargs={$bd}" last_block_cls_only=true \
      length_multiple=8 --top 30 --out "$work/profile_bd" >>"$log" 2>&1
    cp "$work/profile_bd/profile_summary.txt" "$OUT/layouts_profile_bd_cls_m8.txt"
    ;;
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
      --lengths 1024 4096 16384 --out "$work/jax" --cache-dir /tmp/jax_cache --compile-workers 8 \
      --run-seconds 2 >>"$log" 2>&1
    echo "speed_memory exit $?" >>"$log"
    jax_results=()
    [ -f "$work/jax/speed_memory.json" ] && jax_results=(--jax-results "$work/jax/speed_memory.json")
    timeout 330 python benchmarks/torch_step.py --dtype bfloat16 --lengths 1024 4096 16384 \
      --run-seconds 2 "${jax_results[@]}" --out "$work/torch" >>"$log" 2>&1
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
