#!/usr/bin/env bash
# Small all_reduces on a 2-GPU machine, where one run's busbw is mostly launch jitter:
# NCCL's defaults against toporun's plan, RUNS (8) alternating runs of each, every run
# three trials of TRIAL_S (0.5) s per size (MIB: 1,2,4), GRAPH=1 replaying them from a
# CUDA graph (eager runs at these sizes time the CPU launch); the table, plan / default.
# Then the node split in two under --colocated=warn (another hostname), for each node's
# NCCL report line. Everything lands in OUT as it comes.
# Usage (device): scripts/device/gpu_busbw_small.sh TOPORUN OUT
set -uo pipefail
T=$(readlink -f "$1") OUT=$(readlink -f "$2")
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
B=examples/allreduce_bench.py
"$T" launch --dry-run --format env --nproc-per-node=gpu $B | grep -v '^#' > "$OUT/plan.env"
mapfile -t plan < "$OUT/plan.env"
for r in $(seq 1 "${RUNS:-8}"); do
  for tag in default plan; do
    vars=(); [ $tag = plan ] && vars=("${plan[@]}")
    env "${vars[@]}" BENCH_MIB="${MIB:-1,2,4}" BENCH_TRIAL_S="${TRIAL_S:-0.5}" BENCH_GRAPH="${GRAPH:-0}" PROBE_TAG=$tag timeout 90 \
      "$T" --standalone --nproc-per-node=2 $B 2>&1 | grep "^RESULT" >> "$OUT/busbw-small.txt"
  done
done
python3 scripts/bench/busbw_table.py "$OUT/busbw-small.txt" | tee "$OUT/busbw-small-table.txt"
bash scripts/device/gpu_split_node.sh "$T" "$OUT" 0 1 uts 29814 127.0.0.1 warn | tee "$OUT/split-warn.txt"
