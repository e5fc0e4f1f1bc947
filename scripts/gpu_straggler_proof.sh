#!/usr/bin/env bash
# Issue 39 on a 2-GPU machine: the GPU straggler named from each rank's GPU time in
# collectives (--gpu-timing on, the default), nobody named in a balanced job, and
# the step-time cost of the timing and the dumps against --gpu-timing off
# (alternating runs, a sub-ms step and a ~60 ms step); then small all_reduces from a
# CUDA graph, NCCL's defaults against toporun's plan (issue 37). Each stage runs while
# the call has time (LIMIT, 560 s) and writes into OUT as it goes.
# JOBS (slow balanced; empty: none), COST_ENV (variables for the cost runs only, as
# TORCH_INCLUDE_STACK_TRACE=0).
# Usage (device): mkdir -p OUT && scripts/gpu_straggler_proof.sh TOPORUN OUT
set -uo pipefail
T=$(readlink -f "$1") OUT=$(readlink -f "$2")
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R=scripts/gpu_nccl_straggler_rank.py LIMIT=${LIMIT:-560}
left() { echo $((LIMIT - SECONDS)); }
S=$OUT/summary.txt
named() {  # NAME SECS VAR=VALUE...: a 2-rank job under toporun's defaults, its straggler lines
  local name=$1 secs=$2; shift 2
  env "$@" SECS="$secs" python3 scripts/timed_run.py $((secs + 40)) "$OUT/$name.out" "$OUT/$name.err" \
    "$T" --standalone --nproc-per-node=2 --straggler-window=30 --status-port=29555 $R > "$OUT/$name.exit" &
  local pid=$!
  sleep $((secs - 5)); curl -s localhost:29555/metrics | grep -E "^toporun_(rank_gpu_wait_share|collective_busbw|rank_wait_share|straggler)" > "$OUT/$name.metrics"
  wait $pid; echo "$name: $(cat "$OUT/$name.exit") $(grep step_ms "$OUT/$name.out")" | tee -a "$S"
  grep -E "toporun: (straggler|warning)" "$OUT/$name.err" | cut -c1-400 | tee -a "$S"
  cat "$OUT/$name.metrics" >> "$S"
}
for j in ${JOBS-slow balanced}; do
  [ "$(left)" -gt 120 ] || break
  case $j in
    slow) named slow 70 SLOW_RANK=1 FACTOR=3 ;;
    balanced) named balanced 55 ;;
  esac
done
echo "== cost: --gpu-timing on (default) against off, step ms of rank 0, alternating" | tee -a "$S"
for step in "small SIZE=4096 WORK=2" "large SIZE=8192 WORK=40 BUCKET_MIB=25"; do
  read -r tag vars <<< "$step"
  for run in 1 2 3; do
    for timing in on off; do
      [ "$(left)" -gt 110 ] || break 3
      ms=$(env $vars ${COST_ENV:-} SECS=18 timeout 60 "$T" --standalone --nproc-per-node=2 --gpu-timing=$timing $R 2>/dev/null | grep -o 'step_ms [0-9.]*')
      echo "$tag gpu-timing=$timing run $run: $ms" | tee -a "$S"
    done
  done
done
if [ "$(left)" -gt 60 ]; then
  echo "== small all_reduces from a CUDA graph" | tee -a "$S"
  GRAPH=1 RUNS=3 MIB=1,2,4,8 TRIAL_S=0.2 timeout $(($(left) - 5)) bash scripts/gpu_busbw_small.sh "$T" "$OUT" > "$OUT/graph.log" 2>&1
  tail -6 "$OUT/busbw-small-table.txt" >> "$S"
fi
echo "== done at $SECONDS s" | tee -a "$S"
