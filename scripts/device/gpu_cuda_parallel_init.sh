#!/usr/bin/env bash
# Whether the CUDA driver serialises start-up within a process or across processes
# (issue 52): contexts set up in one process against one process a GPU (each seeing
# only its GPU, or all), whole processes timed from outside; releasing contexts a
# thread per GPU, or leaving them to the process's exit.
# Usage (device): scripts/device/gpu_cuda_parallel_init.sh OUT
set -uo pipefail
OUT=$(readlink -f "$1"); mkdir -p "$OUT"; cd "$(dirname "$0")/../.."
P=scripts/device/gpu_cuda_init_profile.py S=$OUT/parallel-init.txt
N=$(nvidia-smi -L | wc -l)
# wall FILE CMD...: CMD's stdout to FILE; prints the seconds CMD took.
wall() { local f=$1 s=$EPOCHREALTIME; shift; "$@" > "$f"; awk -v s=$s -v e=$EPOCHREALTIME 'BEGIN{printf "%.3f", e-s}'; }
each() {  # VISIBLE(own|all): one ctx-only process a GPU, all at once
  for i in $(seq 0 $((N - 1))); do
    if [ "$1" = own ]; then CUDA_VISIBLE_DEVICES=$i python3 $P ctx-only > "$OUT/each-$1-$i.json" & else ONLY=$i python3 $P ctx-only > "$OUT/each-$1-$i.json" & fi
  done; wait
}
for r in 1 2 3; do
  echo "one process, $N GPUs, ctx-only: $(wall /dev/null python3 $P ctx-only) s" | tee -a "$S"
  echo "one process a GPU (each sees its own), at once: $(wall /dev/null each own) s; cuInit+setup each: $(cat "$OUT"/each-own-*.json | python3 -c 'import json,sys; print([round(j["cuinit_s"]+j["setup_s"],3) for j in map(json.loads, sys.stdin)])')" | tee -a "$S"
  echo "$N processes (each sees all, sets up its own), at once: $(wall /dev/null each all) s" | tee -a "$S"
  echo "release a thread a GPU: $(wall "$OUT/rt-$r.json" python3 $P release-threads) s $(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print("release_s", j["release_s"])' "$OUT/rt-$r.json")" | tee -a "$S"
  echo "no release (exit does it): $(wall "$OUT/nr-$r.json" python3 $P no-release) s" | tee -a "$S"
  echo "serial release: $(wall "$OUT/sr-$r.json" python3 $P ctx-only) s $(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print("release_s", j["release_s"])' "$OUT/sr-$r.json")" | tee -a "$S"
done
