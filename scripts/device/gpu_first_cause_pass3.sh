#!/usr/bin/env bash
# Issue 62's GPU points (and issue 61's busy rank on 4 GPUs), stage by stage (STAGES),
# each working in WORK (/tmp/pass3), written to OUT/summary.txt as it goes and
# OUT/results.tgz (all of WORK) after each stage:
#   failures2 failures4  scripts/device/gpu_nccl_failures.sh on 2 and 4 ranks with the
#             cases of CASES3 (skip sysexit sidebusy): a same-group skipped all_reduce,
#             sys.exit("...") on rank 1, a stuck group under a busy side group
#   hangs     scripts/device/gpu_profiler.sh hang2 and hang4 with CASES "eval spin",
#             --hang-timeout HANG_TIMEOUT (15) --on-hang stop: a 35 s evaluation on rank
#             0 must exit 0, a rank spinning in Python must be stopped
#   off4      4 ranks under --nccl-profiler off for 40 s: no rank prints torch's
#             deprecation warning of the flight recorder's variables
# Usage (device): scripts/device/gpu_first_cause_pass3.sh TOPORUN OUT
set -uo pipefail
T=$(readlink -f "$1") RESULTS=$(readlink -f "$2") W=${WORK:-/tmp/pass3}
mkdir -p "$W" "$RESULTS"
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
S=$RESULTS/summary.txt
pack() { tar czf "$RESULTS/results.tgz.tmp" -C "$W" . && mv "$RESULTS/results.tgz.tmp" "$RESULTS/results.tgz"; }
failures() {  # NPROC
  NPROC=$1 scripts/device/gpu_nccl_failures.sh "$T" "$W/failures$1" ${CASES3:-skip sysexit sidebusy} > /dev/null 2>&1
  echo "== failures on $1 ranks" >> "$S"; cat "$W/failures$1/summary.txt" >> "$S"
}
hangs() {
  HANG_TIMEOUT=${HANG_TIMEOUT:-15} EVAL_ON_HANG=stop STAGES="hang2 hang4" CASES="eval spin" PROFILER_WORK=$W/hangs \
    scripts/device/gpu_profiler.sh "$T" /tmp/pass3-hangs > /dev/null 2>&1
  cat /tmp/pass3-hangs/summary.txt >> "$S"
}
off4() {
  local d=$W/off4; mkdir -p "$d"
  echo "== off4: $(SECS=40 python3 scripts/device/timed_run.py 100 "$d/stdout" "$d/stderr" "$T" --standalone --nproc-per-node=4 --nccl-profiler off --straggler-window=30 scripts/device/gpu_nccl_straggler_rank.py) $(cat "$d/stdout" | tail -2 | tr '\n' ' '); deprecation lines: $(grep -c deprecated "$d/stderr"); toporun warnings: $(grep -c 'toporun: warning' "$d/stderr")" >> "$S"
}
nvidia-smi -L > "$W/gpus.txt" 2>&1; cat "$W/gpus.txt" >> "$S"
for stage in ${STAGES:-failures2 failures4 hangs off4}; do
  case $stage in
    failures2|failures4) failures "${stage#failures}" ;;
    *) $stage ;;
  esac
  pack
done
cat "$S"
