#!/usr/bin/env bash
# On a lent GPU machine: the straggler finding with ranks whose compute runs on a real
# GPU. Two ranks share the one GPU (gloo carries the gradients on the CPU, as NCCL
# refuses two ranks on one GPU); rank 1 does three times the GPU work. toporun must
# name rank 1, and `toporun top` show both ranks on GPU 0 with its clocks.
# Usage (device): scripts/device/gpu_straggler.sh  (target/release/toporun carried); output
# in $OUT (copied to tests/fixtures/device/gpu-straggler-<gpu>/).
set -uo pipefail
T=${TOPORUN:-target/release/toporun}
OUT=${OUT:-/tmp/gpu-straggler}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
logs=$(mktemp -d)
work=$(mktemp -d)
DEVICE=cuda SECS=40 SLOW_RANK=1 FACTOR=3 OUT="$work" "$T" --standalone --nproc-per-node=2 \
  --straggler-window=15 --log-dir "$logs" launcher/tests/scripts/straggler_rank.py \
  >"$OUT/job.out" 2>"$OUT/job.err" &
job=$!
sleep 30
dir=$(ls -d "$logs"/*/ | head -1)
"$T" top --once "$dir" >"$OUT/top.txt" 2>&1
"$T" top --once --format json "$dir" >"$OUT/top.json" 2>&1
wait "$job"; echo "job exit $?" >>"$OUT/job.err"
cat "$OUT/top.txt"; grep -v "^\*\*\|OMP" "$OUT/job.err"
