#!/usr/bin/env bash
# On a GPU machine (NPROC ranks, 2 by default): realistic NCCL failures (scripts/device/gpu_nccl_failure_rank.py), one
# rank per GPU, as a user runs them: --exit-codes classified, and --hang-timeout 15
# --on-hang stop except for the watchdog case (no hang timeout, NCCL's own 25 s).
# A case NAME-default runs with toporun's defaults (no hang options). Keeps each case's
# stdout, stderr (each line stamped with its second), hang.json, flight-recorder dumps
# and fr-trace, and prints each case's exit code, time and first lines; after each
# case OUT/../nccl-failures.tar.gz holds everything so far. Each case is killed at
# DEADLINE s (60; the watchdog case 130, a -default case 40). Usage: scripts/device/gpu_nccl_failures.sh BIN OUT [CASE...]
set -uo pipefail
BIN=$(readlink -f "$1") OUT=$(readlink -f "$2"); shift 2
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
cases=${*:-leaver stuck metrics skip watchdog segv valueerror oom dataloader}
for case in $cases; do
  hang=(--hang-timeout=15 --on-hang=stop)
  [ "$case" = watchdog ] || [ "${case%-default}" != "$case" ] && hang=()
  # NCCL's watchdog aborts at 25 s and PyTorch then waits for dumps; a -default case
  # reports and runs on (NCCL's 10 minutes): it is cut at 40 s.
  deadline=${DEADLINE:-60}
  [ "$case" = watchdog ] && deadline=130
  [ "${case%-default}" != "$case" ] && deadline=${DEFAULT_DEADLINE:-40}
  d=$OUT/$case; rm -rf "$d"; mkdir -p "$d"
  ran=$(CASE=${case%-default} python3 scripts/device/timed_run.py "$deadline" "$d/stdout" "$d/stderr" \
    "$BIN" --standalone --nproc-per-node="${NPROC:-2}" --exit-codes=classified "${hang[@]}" \
    --log-dir "$d/run" scripts/device/gpu_nccl_failure_rank.py)
  for a in "$d"/run/*/attempt_0; do
    [ -f "$a/hang.json" ] && cp "$a/hang.json" "$d/"
    [ -d "$a/nccl-counters" ] && cp -r "$a/nccl-counters" "$d/"
    if [ -d "$a/fr" ] && [ -n "$(ls "$a/fr")" ]; then
      mkdir -p "$d/fr" && cp "$a"/fr/* "$d/fr/"
      "$BIN" fr-trace "$a/fr" > "$d/fr-trace.txt" 2>&1
    fi
  done
  rm -rf "$d/run"
  {
    echo "== $case: $ran (${hang[*]:-no hang options})"
    grep -E "^\[ *[0-9.]+\] toporun: " "$d/stderr" | grep -vE "toporun: (rendezvous|info|nccl|note: NCCL|python:|warning: no GPU)" | head -4 | cut -c1-500
    grep -m2 -E "Watchdog caught|heartbeat" "$d/stderr" | cut -c1-300
  } | tee -a "$OUT/summary.txt"
  tar czf "$OUT/../nccl-failures.tar.gz" -C "$(dirname "$OUT")" "$(basename "$OUT")"
done
