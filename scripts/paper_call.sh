#!/usr/bin/env bash
# One device call of paper cells (docs/reproduce.md): a 1-minute GPU smoke test, then the named
# cells in order, each with the training time that is left, until the call's minutes run out.
#
#   bash scripts/paper_call.sh MINUTES CELL [CELL ...]
#
# MINUTES is the call's whole budget (the device tool allows 10 a call; use at most 9). Each
# cell runs `python scripts/reproduce.py CELL --config.max_train_minutes=M`, with M the
# minutes left (to the second) minus a reserve for what runs after train.py's time budget is
# spent: the step in progress, the stop's validation, save and tests, the comparison and the
# copy (RESERVE_S seconds, default 60; RESERVE_MIN=N sets it to N minutes). train.py's budget
# counts from its own start, so its start-up and compiles are inside M.
# A cell stopped by its budget is resumed by the next call on the same warm machine (same
# command: its checkpoints stay in runs/paper/CELL); on a fresh machine it starts again. A
# cell that is not finished stops the call, so the cells always run in plan order.
#
# Environment: OUT (default /tmp/paper_call) receives at most 8 files: call.log and one
# CELL.tar.gz per cell (config.json, metrics.jsonl, results.json, comparison.md,
# reproduce.json, train.log; never checkpoints). DATA (default .data) holds imdb/ and
# cifar10/ for the text and image cells. EXTRA holds more --config.* flags for every cell
# (the CPU rehearsal shrinks the runs with it). SMOKE=0 skips the smoke test.
set -uo pipefail
minutes=${1:?usage: bash scripts/paper_call.sh MINUTES CELL [CELL ...]}
shift
[ $# -gt 0 ] || { echo "paper_call.sh: name at least one cell (python scripts/reproduce.py --list)"; exit 2; }
OUT=${OUT:-/tmp/paper_call}
DATA=${DATA:-.data}
RESERVE_S=${RESERVE_S:-$(( ${RESERVE_MIN:-1} * 60 ))}
read -r -a extra <<< "${EXTRA:-}"
mkdir -p "$OUT"
deadline=$(( $(date +%s) + ${minutes%.*} * 60 ))
log="$OUT/call.log"
say() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$log"; }
left_s() { echo $(( deadline - $(date +%s) )); }
left_min() { echo $(( $(left_s) / 60 )); }

say "call of $minutes min: $*"
if [ "${SMOKE:-1}" != 0 ]; then   # wheels, imports and 20 train steps on this device
  LOG="$log" bash scripts/gpu_smoke.sh || { tail -n 20 "$log"; exit 1; }
fi

for cell in "$@"; do
  budget_s=$(( $(left_s) - RESERVE_S ))
  if [ "$budget_s" -lt 60 ]; then say "$cell: no time left in this call"; break; fi
  budget=$(printf "%d.%02d" $(( budget_s / 60 )) $(( budget_s % 60 * 100 / 60 )))
  data=()
  case "$cell" in
    text_*) data=("--config.data.data_dir=$DATA/imdb");;
    image_*) data=("--config.data.data_dir=$DATA/cifar10");;
  esac
  say "$cell: training for at most $budget min"
  python scripts/reproduce.py "$cell" "--config.max_train_minutes=$budget" "${data[@]}" \
    "${extra[@]}" > "/tmp/paper_$cell.log" 2>&1
  status=$?
  tail -n 25 "/tmp/paper_$cell.log" >> "$log"
  dir=runs/paper/$cell
  cp "/tmp/paper_$cell.log" "$dir/train.log" 2>/dev/null
  files=()
  for f in config.json metrics.jsonl results.json comparison.md reproduce.json train.log; do
    [ -f "$dir/$f" ] && files+=("$f")
  done
  [ ${#files[@]} -gt 0 ] && tar -czf "$OUT/$cell.tar.gz" -C "$dir" "${files[@]}"
  case $status in
    0) say "$cell: finished"; cat "$dir/comparison.md" | tee -a "$log";;
    3) say "$cell: stopped by its budget; the next call on this machine resumes it"; break;;
    *) say "$cell: exit $status (see $cell.tar.gz/train.log)"; break;;
  esac
done
say "call done; $(left_min) min left"
