#!/usr/bin/env bash
# On a 2-GPU machine: realistic NCCL failures (scripts/gpu_nccl_failure_rank.py), one
# rank per GPU, as a user runs them: --exit-codes classified, and --hang-timeout 15
# --on-hang stop except for the watchdog case (no hang timeout, NCCL's own 25 s).
# Keeps each case's stdout, stderr, hang.json, flight-recorder dumps and fr-trace, and
# prints each case's exit code, time and first lines. HANG_ARGS overrides the hang
# options (empty: toporun's defaults). Usage: scripts/gpu_nccl_failures.sh BIN OUT [CASE...]
set -uo pipefail
BIN=$(readlink -f "$1") OUT=$(readlink -f "$2"); shift 2
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
cases=${*:-leaver stuck metrics skip watchdog segv valueerror oom dataloader}
for case in $cases; do
  read -ra hang <<< "${HANG_ARGS---hang-timeout=15 --on-hang=stop}"
  [ "$case" = watchdog ] && hang=()
  d=$OUT/$case; rm -rf "$d"; mkdir -p "$d"
  start=$(date +%s%N)
  CASE=$case timeout 300 "$BIN" --standalone --nproc-per-node=2 --exit-codes=classified "${hang[@]}" \
    --log-dir "$d/run" scripts/gpu_nccl_failure_rank.py > "$d/stdout" 2> "$d/stderr"
  code=$?
  secs=$(( ($(date +%s%N) - start) / 1000000 ))
  for a in "$d"/run/*/attempt_0; do
    [ -f "$a/hang.json" ] && cp "$a/hang.json" "$d/"
    if [ -d "$a/fr" ] && [ -n "$(ls "$a/fr")" ]; then
      mkdir -p "$d/fr" && cp "$a"/fr/* "$d/fr/"
      "$BIN" fr-trace "$a/fr" > "$d/fr-trace.txt" 2>&1
    fi
  done
  rm -rf "$d/run"
  {
    echo "== $case: exit $code after $secs ms (${hang[*]:-no hang timeout})"
    grep -E "^toporun: " "$d/stderr" | grep -vE "^toporun: (rendezvous|info|nccl|note: NCCL)" | head -4 | cut -c1-400
    grep -m2 -E "Watchdog caught|heartbeat" "$d/stderr" | cut -c1-300
  } | tee -a "$OUT/summary.txt"
done
