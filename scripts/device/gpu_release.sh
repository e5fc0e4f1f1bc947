#!/usr/bin/env bash
# On a GPU machine (no cargo there): a rank leaves a child (out of its process group)
# holding GPU memory and fails; before the restart toporun waits for the memory, and
# names the holder when it stays. HOLD=10: waited for, the restart runs (exit 0).
# HOLD=60: still held after 30 s, the job ends (exit 80 under classified).
# Usage: scripts/device/gpu_release.sh BIN OUT
set -uo pipefail
BIN=$1 OUT=$2
mkdir -p "$OUT"
for hold in 10 60; do
  start=$(date +%s%N)
  HOLD=$hold "$BIN" --standalone --nproc-per-node=1 --nccl-report=off --max-restarts=1 \
    --exit-codes=classified scripts/device/gpu_release_rank.py >"$OUT/hold-$hold.log" 2>&1
  code=$?
  echo "== HOLD=$hold: exit $code after $(( ($(date +%s%N) - start) / 1000000 )) ms"
  grep -E "child pid|GPU memory|root cause|second attempt|restart" "$OUT/hold-$hold.log" | cut -c1-400
done | tee "$OUT/summary.txt"
