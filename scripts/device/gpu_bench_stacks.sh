#!/usr/bin/env bash
# On a GPU machine (no cargo there): what reading 8 ranks' stacks costs with that
# machine's Python (toporun bench stacks), 3 runs at each interval, beside the CPU.
# Usage: scripts/device/gpu_bench_stacks.sh BIN OUT
set -euo pipefail
BIN=$1 OUT=$2
mkdir -p "$OUT"
{
  echo "# $(date -u +%FT%TZ) $(nproc) CPUs, $(python3 -c 'import sys; print(sys.version.split()[0])'), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  for _ in 1 2 3; do
    for ms in 1000 500; do
      "$BIN" bench stacks --python python3 --ranks 8 --seconds 10 --interval-ms "$ms"
    done
  done
} | tee "$OUT/bench-stacks.txt"
