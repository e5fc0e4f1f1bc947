#!/usr/bin/env bash
# On a GPU machine (no cargo there): does a hang stopped by toporun (--on-hang stop)
# leave flight-recorder dumps? Stock ProcessGroupNCCL (TORCH_DIST_USE_NCCL2=0) should
# dump when toporun sets `exception_dump` in the workers' store; nccl2 has no trigger.
# One rank per GPU. Usage: scripts/gpu_fr_dumps.sh BIN OUT
set -uo pipefail
BIN=$1 OUT=$2
export NCCL_NVLS_ENABLE=0
gpus=$(nvidia-smi -L | wc -l)
for pg in legacy nccl2; do
  logs="$OUT/$pg"
  mkdir -p "$logs"
  if [ "$pg" = legacy ]; then export TORCH_DIST_USE_NCCL2=0; else unset TORCH_DIST_USE_NCCL2; fi
  start=$(date +%s.%N)
  timeout 300 "$BIN" --standalone --nproc-per-node="$gpus" --hang-timeout=10 --on-hang=stop \
    --log-dir "$logs/run" scripts/gpu_hang_rank.py >"$logs/stdout" 2>"$logs/stderr"
  code=$?
  end=$(date +%s.%N)
  {
    echo "exit $code after $(echo "$end - $start" | bc) s"
    find "$logs/run" -path '*/fr/*' -type f -printf '%p %s bytes\n'
  } >"$logs/summary"
  [ -x "$BIN" ] && for d in "$logs"/run/*/attempt_0/fr; do "$BIN" fr-trace "$d" >"$logs/fr-trace.txt" 2>&1; done
  echo "== $pg"; cat "$logs/summary"; grep -E "toporun: (hang|flight)|torch " "$logs/stderr" "$logs/stdout" | head -20
done
