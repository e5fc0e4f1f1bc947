#!/usr/bin/env bash
# One call on a 2-GPU machine (nvidia-h100-x2): the NCCL failure cases
# (scripts/device/gpu_nccl_failures.sh: issue 38), the straggler jobs with their
# flight-recorder dumps (scripts/device/gpu_nccl_straggler.sh: issue 39) and the 1 MiB
# all_reduce, NCCL's defaults against toporun's plan, 8 alternating runs (issue 37).
# Each stage runs only while the call has time left (LIMIT s, 570); everything lands
# in OUT as it comes (tar files), so a call cut short still brings back what ran.
# Usage (device): bash scripts/device/gpu_nccl_proof.sh BIN OUT
set -uo pipefail
BIN=$(readlink -f "$1") OUT=$(readlink -f "$2")
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
LIMIT=${LIMIT:-570}
left() { echo $((LIMIT - SECONDS)); }
W=/tmp/nccl-proof; mkdir -p "$W"
echo "== failures (t=$SECONDS s)"
bash scripts/device/gpu_nccl_failures.sh "$BIN" "$W/failures" ${CASES:-leaver stuck metrics watchdog leaver-default skip segv valueerror oom dataloader}
cp "$W/nccl-failures.tar.gz" "$OUT/"
if [ "$(left)" -gt 130 ]; then
  echo "== straggler jobs (t=$SECONDS s)"
  COST=0 bash scripts/device/gpu_nccl_straggler.sh "$BIN" "$W/straggler"
  tar czf "$OUT/nccl-straggler.tar.gz" -C "$W" straggler
fi
if [ "$(left)" -gt 60 ]; then
  echo "== 1 MiB all_reduce, default / plan alternating (t=$SECONDS s)"
  plan=$("$BIN" launch --dry-run --format env --nproc-per-node=gpu examples/allreduce_bench.py | grep -v '^#' | xargs)
  for r in 1 2 3 4 5 6 7 8; do
    [ "$(left)" -gt 15 ] || break
    for tag in default plan; do
      vars=(); [ $tag = plan ] && read -ra vars <<< "$plan"
      env "${vars[@]}" BENCH_MIB=1 PROBE_TAG=$tag timeout 60 "$BIN" --standalone --nproc-per-node=2 \
        examples/allreduce_bench.py 2>&1 | grep "^RESULT" | tee -a "$OUT/busbw-1mib.txt"
    done
  done
fi
if [ "$(left)" -gt 60 ]; then
  echo "== cost of TORCH_NCCL_ENABLE_TIMING (t=$SECONDS s)"
  JOBS=0 COST_RUNS=$(( $(left) > 150 ? 2 : 1 )) COST_SECS=8 bash scripts/device/gpu_nccl_straggler.sh "$BIN" "$W/cost" > "$OUT/cost.txt" 2>&1
fi
echo "== done at t=$SECONDS s"
