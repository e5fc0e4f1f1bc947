#!/usr/bin/env bash
# On a lent GPU machine: `toporun top` for a real CUDA rank (NCCL, one GPU), read
# while it runs a loop of bf16 matmuls and all_reduces: the GPU's utilisation, SM
# clock against its maximum and clock limits (NVML), as text and JSON; then the
# sampling cost with the straggler tracker against sampling alone (bench stacks).
# Usage (device): scripts/device/gpu_top.sh  (target/release/toporun carried); output in
# $OUT (copied to tests/fixtures/device/gpu-top-<gpu>/).
set -uo pipefail
T=${TOPORUN:-target/release/toporun}
OUT=${OUT:-/tmp/gpu-top}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
logs=$(mktemp -d)
STEPS=4000 "$T" --standalone --nproc-per-node=1 --straggler-window=15 --log-dir "$logs" \
  scripts/device/gpu_step_rank.py >"$OUT/job.out" 2>"$OUT/job.err" &
job=$!
for i in $(seq 60); do
  dir=$(ls -d "$logs"/*/ 2>/dev/null | head -1)
  [ -n "$dir" ] && [ -S "$dir/stacks.sock" ] && break
  sleep 0.5
done
sleep 15
"$T" top --once "$dir" >"$OUT/top.txt" 2>&1
"$T" top --once --format json "$dir" >"$OUT/top.json" 2>&1
nvidia-smi --query-gpu=index,name,utilization.gpu,clocks.sm,clocks.max.sm,clocks_event_reasons.active --format=csv >"$OUT/nvidia-smi.csv" 2>&1
wait "$job"; echo "job exit $?" >>"$OUT/job.err"
py=$(command -v python3)
for ms in 1000 250; do
  "$T" bench stacks --python "$py" --ranks 8 --seconds 20 --interval-ms "$ms" >>"$OUT/bench-stacks.jsonl"
done
cat "$OUT/top.txt" "$OUT/nvidia-smi.csv" "$OUT/bench-stacks.jsonl"; tail -5 "$OUT/job.err"
