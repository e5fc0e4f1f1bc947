#!/usr/bin/env bash
# Start-up on a GPU machine (absolute times count only there): 8 no-op ranks under
# each given toporun build against the real torchrun and against the floor, a bash
# loop starting the same 8 /bin/true (scripts/bench/bench_startup.py, 3 calls each, builds
# alternating so that a burst of load falls on both). $TMPDIR's file system is
# recorded beside: creating and removing the run directory costs what it costs there.
# Usage (device): scripts/device/gpu_startup_bench.sh OUT TOPORUN [TOPORUN ...]
set -uo pipefail
OUT=$1; shift
mkdir -p "$OUT"
TORCHRUN=$(command -v torchrun || echo "$(dirname "$(command -v python3)")/torchrun")
{
  echo "TMPDIR=${TMPDIR:-/tmp}: $(stat -f -c %T "${TMPDIR:-/tmp}")"
  nproc; python3 -c 'import torch; print("torch", torch.__version__)'
} > "$OUT/machine.txt" 2>&1
for round in 1 2 3; do
  for bin in "$@"; do
    printf '%s round %s ' "$bin" "$round" >> "$OUT/startup.jsonl"
    python3 scripts/bench/bench_startup.py --toporun "$bin" --torchrun "$TORCHRUN" -n 5 --json \
      >> "$OUT/startup.jsonl" 2>> "$OUT/errors.txt"
  done
done
cat "$OUT/machine.txt" "$OUT/startup.jsonl"
