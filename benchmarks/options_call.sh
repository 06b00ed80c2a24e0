#!/usr/bin/env bash
# Issue 45's GPU measurements, in two prepared device calls on one warm machine:
#
#   bash benchmarks/options_call.sh options    # about 6 minutes
#   bash benchmarks/options_call.sh listops [--config.* flags of a third run]   # about 4
#
# options: the slot's smoke test (scripts/gpu_smoke.sh), then every speed option of the train
#   step against the default at 4K and 16K in bfloat16, in one process
#   (benchmarks/speed_options.py), then PyTorch on the same model, eager and torch.compile,
#   with those JAX rows beside it (benchmarks/torch_step.py --jax_results).
# listops: train.py on the ListOps paper config (configs/listops/simple.py, bfloat16, the CLS-only
#   last block, as scripts/reproduce.py's listops_simple cell) for STEPS steps: at full width
#   (the paper cell's data.bucket=0), then with data.group_by_length and its buckets compiled
#   first (--precompile_workers=8), then, if flags are given, at full width with them; with
#   GROUPED_IN_LOOP=1 also grouped with each bucket compiled when first met. Each run stops
#   after LIMIT seconds (default 110). Each metrics.jsonl train window has
#   steps_per_sec_excluding_compile (the steady rate). On the H200 the grouped run's compiles
#   took more than 110 s (benchmarks/results/nvidia-h200): the next call gives it
#   LIMIT=200 STEPS=300 GROUPED_IN_LOOP=1.
#
# OUT (default /tmp/options_call) receives at most 8 files. QUICK=1 is the CPU rehearsal (tiny
# model and lengths, :tiny ListOps).
set -uo pipefail
part=${1:?usage: bash benchmarks/options_call.sh options|listops [flags]}
shift
OUT=${OUT:-/tmp/options_call}
work=/tmp/options_call_work
mkdir -p "$OUT" "$work"
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.9
log="$OUT/$part.log"
say() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$log"; }
quick=(); torch_sizes=(--lengths 4096 16384); listops=configs/listops/simple.py; steps=${STEPS:-200}
if [ "${QUICK:-0}" = 1 ]; then
  quick=(--quick --compile_workers 2); torch_sizes=(--lengths 64 --batch 2)
  listops=configs/listops/simple.py:tiny; steps=${STEPS:-20}
fi

case "$part" in
  options)
    LOG="$log" bash scripts/gpu_smoke.sh || exit 1
    say "speed_options: every option against the default"
    timeout 300 python benchmarks/speed_options.py --out "$work/options" "${quick[@]}" \
      >"$work/options.log" 2>&1
    say "speed_options exit $? (124: stopped by its limit)"; tail -c 6000 "$work/options.log" >>"$log"
    cp "$work"/options/speed_options.{json,md} "$OUT"/ 2>/dev/null
    say "torch_step: PyTorch SDPA and simple, eager and compiled"
    jax=(); [ -f "$work/options/speed_options.json" ] && jax=(--jax_results "$work/options/speed_options.json")
    timeout 150 python benchmarks/torch_step.py --dtype bfloat16 "${torch_sizes[@]}" \
      --run_seconds 1 "${jax[@]}" --out "$work/torch" >"$work/torch.log" 2>&1
    say "torch_step exit $? (124: stopped by its limit)"; tail -c 3000 "$work/torch.log" >>"$log"
    cp "$work"/torch/torch_step.{json,md} "$OUT"/ 2>/dev/null
    ;;
  listops)
    runs=("full_width --config.data.bucket=0"
          "grouped --config.data.group_by_length=True --precompile_workers=8")
    [ "${GROUPED_IN_LOOP:-0}" = 1 ] && runs+=("grouped_in_loop --config.data.group_by_length=True")
    [ $# -gt 0 ] && runs+=("full_width_options --config.data.bucket=0 $*")
    for run in "${runs[@]}"; do
      read -r -a args <<<"$run"; name=${args[0]}
      say "train.py ListOps, $name: ${args[*]:1}"
      rm -rf "$work/listops_$name"   # a measurement starts fresh
      timeout "${LIMIT:-110}" python train.py --config "$listops" --config.model.dtype=bfloat16 \
        --config.model.last_block_cls_only=True --config.num_train_steps="$steps" \
        --config.eval_frequency="$steps" --config.checkpoint_every="$steps" \
        --config.num_eval_steps=2 --config.num_test_steps=2 --xla_cache_dir=/tmp/jax_cache \
        "${args[@]:1}" --workdir "$work/listops_$name" >"$work/listops_$name.log" 2>&1
      say "exit $?"; tail -n 5 "$work/listops_$name.log" >>"$log"
      cp "$work/listops_$name/metrics.jsonl" "$OUT/listops_$name.jsonl" 2>/dev/null
      cp "$work/listops_$name/results.json" "$OUT/listops_${name}_results.json" 2>/dev/null
    done
    ;;
  *) echo "unknown part $part (options or listops)" >&2; exit 2 ;;
esac
say "done"
