#!/usr/bin/env bash
# The first minute of every GPU slot (docs/reproduce.md): the carried wheels import, and
# train.py trains :tiny for 20 steps on the device, validates and tests. Appends to LOG
# (default /dev/stdout); exits 1 with the log's tail when anything fails.
#
#   bash scripts/gpu_smoke.sh
set -uo pipefail
LOG=${LOG:-/dev/stdout}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
  python -c "from simpletron_jax.runtime import platforms; platforms.skip_absent_tpu(); import jax; \
print('jax', jax.__version__, jax.devices())"; } >>"$LOG" 2>&1
echo "== $(date -u +%H:%M:%S) smoke: train.py :tiny, 20 steps" >>"$LOG"
rm -rf /tmp/paper_smoke   # a fresh run: a finished one would be reported, not rerun
if ! python train.py --config configs/listops/simple.py:tiny --workdir /tmp/paper_smoke \
    --config.num_train_steps=20 --config.eval_frequency=20 --config.num_eval_steps=2 \
    --config.num_test_steps=2 --config.data.num_train=2000 >/tmp/paper_smoke.log 2>&1; then
  tail -n 20 /tmp/paper_smoke.log >>"$LOG"
  echo "== smoke test failed" >>"$LOG"; exit 1
fi
python -c "import json; r = json.load(open('/tmp/paper_smoke/results.json')); \
print('smoke: step', r['final_step'], 'steps/s', round(r['steps_per_sec'], 1))" >>"$LOG"
