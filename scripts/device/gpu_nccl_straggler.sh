#!/usr/bin/env bash
# On a 2-GPU machine: what a launcher can read of each collective's GPU time with no
# code change. Jobs (scripts/device/gpu_nccl_straggler_rank.py) under toporun with
# TORCH_NCCL_ENABLE_TIMING=1 and TORCH_NCCL_DEBUG_INFO_PIPE_FILE: every DUMP_EVERY s a
# write to each rank's pipe makes it dump its flight recorder while it trains; the
# dumps are kept (OUT/<job>/dumps/rank<r>-<k>). Jobs: rank 1 doing 3x the GPU work,
# balanced, balanced with an all-ranks checkpoint pause. Then the step-time cost of the
# timing, alternating runs, at a ~4 ms step and a ~50 ms step.
# JOBS names the jobs (slow balanced checkpoint; 0: none), COST=0 skips the cost; COST_RUNS (3) alternations of COST_SECS (12) s.
# Usage (device): scripts/device/gpu_nccl_straggler.sh BIN OUT
set -uo pipefail
BIN=$(readlink -f "$1") OUT=$(readlink -f "$2")
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R=scripts/device/gpu_nccl_straggler_rank.py
mkdir -p "$OUT"
job() {  # NAME VAR=VALUE...: one job with its dumps taken every DUMP_EVERY s
  local name=$1; shift
  local d=$OUT/$name; mkdir -p "$d/dumps" "$d/pipe"
  env "$@" TORCH_NCCL_ENABLE_TIMING=1 TORCH_FR_BUFFER_SIZE=${BUF:-4000} TORCH_NCCL_TRACE_BUFFER_SIZE=${BUF:-4000} \
    TORCH_NCCL_DEBUG_INFO_PIPE_FILE="$d/pipe/rank_" \
    timeout 90 "$BIN" --standalone --nproc-per-node=2 --straggler-window=15 --log-dir "$d/run" $R > "$d/stdout" 2> "$d/stderr" &
  local pid=$! k=0
  sleep 8
  while kill -0 $pid 2>/dev/null; do
    k=$((k + 1))
    for p in "$d"/pipe/rank_*.pipe; do [ -p "$p" ] && timeout 2 sh -c "echo 1 > '$p'"; done
    sleep 1.5
    for f in $(find "$d/run" -path '*/fr/*' -type f 2>/dev/null); do
      cp "$f" "$d/dumps/$(basename "$f")-$k.$(date +%s.%N | cut -c1-14)"
    done
    sleep "${DUMP_EVERY:-3}"
  done
  wait $pid; echo "$name: exit $? $(grep -h step_ms "$d/stdout") dumps $(ls "$d/dumps" | wc -l)" | tee -a "$OUT/summary.txt"
  grep -E "^toporun: (straggler|warning)" "$d/stderr" | cut -c1-300 | tee -a "$OUT/summary.txt"
  rm -rf "$d/run" "$d/pipe"
}
for j in ${JOBS:-slow balanced checkpoint}; do
  case $j in
    slow) job slow SLOW_RANK=1 FACTOR=3 SECS=${SECS:-30} ;;
    balanced) job balanced SECS=${SECS:-30} ;;
    checkpoint) job checkpoint SECS=${SECS:-30} CKPT_EVERY=8 CKPT_S=3 ;;
  esac
done
[ "${COST:-1}" = 1 ] || exit 0
echo "== cost of TORCH_NCCL_ENABLE_TIMING (step ms, rank 0), alternating" | tee -a "$OUT/summary.txt"
for step in "small SIZE=4096 WORK=2" "large SIZE=8192 WORK=40 BUCKET_MIB=25"; do
  read -r tag vars <<< "$step"
  for run in $(seq 1 "${COST_RUNS:-3}"); do
    for timing in 0 1; do
      ms=$(env $vars SECS=${COST_SECS:-12} TORCH_NCCL_ENABLE_TIMING=$timing timeout 60 "$BIN" --standalone --nproc-per-node=2 $R 2>/dev/null | grep -o 'step_ms [0-9.]*')
      echo "$tag timing=$timing run $run: $ms" | tee -a "$OUT/summary.txt"
    done
  done
done
