#!/usr/bin/env bash
# On a GPU machine (no cargo there): toporun's NVML Xid event thread through a real
# NCCL job: does it start (no "not watched" note), report no event on a healthy GPU,
# and cost nothing measurable? Step time with the thread, and with it replaced by an
# empty replay (TOPORUN_XID_REPLAY=/dev/null), alternating, 3 runs each.
# Usage: scripts/device/gpu_xid_watch.sh BIN OUT
set -uo pipefail
BIN=$1 OUT=$2
export NCCL_NVLS_ENABLE=0
gpus=$(nvidia-smi -L | wc -l)
mkdir -p "$OUT"
for run in 1 2 3; do
  for mode in nvml off; do
    log="$OUT/$mode-$run.log"
    if [ "$mode" = off ]; then export TOPORUN_XID_REPLAY=/dev/null; else unset TOPORUN_XID_REPLAY; fi
    "$BIN" --standalone --nproc-per-node="$gpus" --nccl-report=off scripts/device/gpu_step_rank.py >"$log" 2>&1
    echo "$mode run $run: exit $? $(grep -o 'step_ms [0-9.]*' "$log")"
  done
done | tee "$OUT/summary.txt"
echo "Xid lines or notes (expected none):"
grep -h "Xid\|not watched" "$OUT"/*.log | sort | uniq -c
