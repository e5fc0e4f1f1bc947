#!/usr/bin/env bash
# `toporun preflight --measure` against the CUDA driver's floor (issue 64), side by
# side in one call: RUNS alternating runs of each, whole processes timed from outside.
# The floor is a process that does only the driver's start-up: cuInit, a primary
# context per GPU on a thread each, released a thread each
# (scripts/device/gpu_cuda_init_profile.py release-threads). Prints each run, then the
# medians and their ratio. With OLD=another toporun, that build runs third in each
# round (its times in old.txt), and each build's host and pair figures are kept
# (figures.txt) to compare what a change does to them.
# Usage (device): [OLD=toporun] scripts/device/gpu_measure_floor.sh TOPORUN OUT [RUNS]
set -uo pipefail
T=$(readlink -f "$1") OUT=$(readlink -f "$2") RUNS=${3:-7}; mkdir -p "$OUT"
OLD=${OLD:+$(readlink -f "$OLD")}
cd "$(dirname "$0")/../.."
S=$OUT/measure-floor.txt
nvidia-smi -L > "$OUT/gpus.txt"
wall() { local s=$EPOCHREALTIME; "$@" > "$OUT/last.json" 2> "$OUT/last.stderr"; awk -v s=$s -v e=$EPOCHREALTIME 'BEGIN{printf "%.3f", e-s}'; }
# One line of a run's figures: host h2d/d2h per GPU, then the slowest pair.
figures() {
  python3 - "$OUT/last.json" "$1" >> "$OUT/figures.txt" 2>&1 <<'PY'
import json, sys
b = json.load(open(sys.argv[1])).get("bandwidth") or {}
h = " ".join("GPU%d %.1f/%.1f" % (x["gpu"], x["h2d_gbps"], x["d2h_gbps"]) for x in b.get("host", []))
p = min((x["gbps"] for x in b.get("pairs", [])), default=0)
print("%s host %s slowest pair %.1f seconds %.3f" % (sys.argv[2], h, p, b.get("seconds", 0)))
PY
}
: > "$OUT/toporun.txt"; : > "$OUT/floor.txt"; : > "$OUT/old.txt"; : > "$OUT/figures.txt"
for i in $(seq 1 "$RUNS"); do
  t=$(wall "$T" preflight --measure --format json); echo "$t" >> "$OUT/toporun.txt"; figures new
  f=$(wall python3 scripts/device/gpu_cuda_init_profile.py release-threads); echo "$f" >> "$OUT/floor.txt"
  o=""; if [ -n "$OLD" ]; then
    o=$(wall "$OLD" preflight --measure --format json); echo "$o" >> "$OUT/old.txt"; figures old
    o=", old build $o s"
  fi
  echo "run $i: preflight --measure $t s, driver floor $f s$o" | tee -a "$S"
done
"$T" preflight --measure --format json > "$OUT/measure.json" 2> "$OUT/measure.stderr"
python3 - "$OUT" <<'PY' | tee -a "$S"
import statistics, sys
d = sys.argv[1]
t = [float(x) for x in open(f"{d}/toporun.txt")]
f = [float(x) for x in open(f"{d}/floor.txt")]
mt, mf = statistics.median(t), statistics.median(f)
print(f"median: preflight --measure {mt:.3f} s ({min(t):.3f}-{max(t):.3f}), floor {mf:.3f} s ({min(f):.3f}-{max(f):.3f}), ratio {mt / mf:.2f}")
o = [float(x) for x in open(f"{d}/old.txt")]
if o:
    mo = statistics.median(o)
    print(f"median: old build {mo:.3f} s ({min(o):.3f}-{max(o):.3f}), ratio {mo / mf:.2f}")
PY
