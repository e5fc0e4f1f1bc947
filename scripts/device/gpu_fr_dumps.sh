#!/usr/bin/env bash
# On a GPU machine (no cargo there): does a hang stopped by toporun (--on-hang stop)
# leave flight-recorder dumps? Stock ProcessGroupNCCL dumps when toporun sets
# `exception_dump` in the workers' store, if its monitor polls the store
# (TORCH_NCCL_DUMP_ON_TIMEOUT); nccl2 (torch >= 2.15, unless TORCH_DIST_USE_NCCL2=0)
# has no trigger. One rank per GPU. Usage: scripts/device/gpu_fr_dumps.sh BIN OUT
set -uo pipefail
BIN=$1 OUT=$2
export NCCL_NVLS_ENABLE=0 TORCH_DIST_USE_NCCL2=0
gpus=$(nvidia-smi -L | wc -l)
for case in ${CASES:-toporun-default user-dump-off}; do
  logs="$OUT/$case"
  mkdir -p "$logs"
  if [ "$case" = user-dump-off ]; then export TORCH_NCCL_DUMP_ON_TIMEOUT=0; fi
  # What the ranks and torch's C++ log say about the store and the monitor.
  if [ "$case" = diagnose ]; then export FR_DIAG=1 TORCH_CPP_LOG_LEVEL=INFO; fi
  start=$(date +%s%N)
  timeout 300 "$BIN" --standalone --nproc-per-node="$gpus" --hang-timeout=10 --on-hang=stop \
    --log-dir "$logs/run" scripts/device/gpu_hang_rank.py >"$logs/stdout" 2>"$logs/stderr"
  code=$?
  {
    echo "exit $code after $(( ($(date +%s%N) - start) / 1000000 )) ms"
    find "$logs/run" -path '*/fr/*' -type f -printf '%f %s bytes\n'
  } >"$logs/summary"
  for d in "$logs"/run/*/attempt_0/fr; do
    "$BIN" fr-trace "$d" >"$logs/fr-trace.txt" 2>&1
    mkdir -p "$logs/fr" && cp "$d"/* "$logs/fr/" 2>/dev/null
  done
  echo "== $case"; cat "$logs/summary" "$logs/fr-trace.txt"
  grep -iE "toporun: (hang|flight|note)|torch |dump|diag|monitor|heartbeat" "$logs/stderr" "$logs/stdout" | cut -c1-300 | head -30
done
