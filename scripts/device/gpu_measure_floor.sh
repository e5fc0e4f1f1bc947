#!/usr/bin/env bash
# `toporun preflight --measure` against the CUDA driver's floor (issue 64), side by
# side in one call: RUNS alternating runs of each, whole processes timed from outside.
# The floor is a process that does only the driver's start-up: cuInit, a primary
# context per GPU on a thread each, released a thread each
# (scripts/device/gpu_cuda_init_profile.py release-threads). Prints each run, then the
# medians and their ratio.
# Usage (device): scripts/device/gpu_measure_floor.sh TOPORUN OUT [RUNS]
set -uo pipefail
T=$(readlink -f "$1") OUT=$(readlink -f "$2") RUNS=${3:-7}; mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
S=$OUT/measure-floor.txt
nvidia-smi -L > "$OUT/gpus.txt"
wall() { local s=$EPOCHREALTIME; "$@" > /dev/null 2>&1; awk -v s=$s -v e=$EPOCHREALTIME 'BEGIN{printf "%.3f", e-s}'; }
: > "$OUT/toporun.txt"; : > "$OUT/floor.txt"
for i in $(seq 1 "$RUNS"); do
  t=$(wall "$T" preflight --measure --format json); echo "$t" >> "$OUT/toporun.txt"
  f=$(wall python3 scripts/device/gpu_cuda_init_profile.py release-threads); echo "$f" >> "$OUT/floor.txt"
  echo "run $i: preflight --measure $t s, driver floor $f s" | tee -a "$S"
done
"$T" preflight --measure --format json > "$OUT/measure.json" 2> "$OUT/measure.stderr"
python3 - "$OUT" <<'PY' | tee -a "$S"
import statistics, sys
d = sys.argv[1]
t = [float(x) for x in open(f"{d}/toporun.txt")]
f = [float(x) for x in open(f"{d}/floor.txt")]
mt, mf = statistics.median(t), statistics.median(f)
print(f"median: preflight --measure {mt:.3f} s ({min(t):.3f}-{max(t):.3f}), floor {mf:.3f} s ({min(f):.3f}-{max(f):.3f}), ratio {mt / mf:.2f}")
PY
