#!/usr/bin/env bash
# Where `toporun preflight --measure` spends its time on a GPU host (issue 52): the
# whole process timed RUNS times (all GPUs, and the first two alone), its own split
# (cuInit, setup, copies) from the JSON, the driver API's steps timed from Python
# (scripts/device/gpu_cuda_init_profile.py: cuInit by visible GPUs, setup one GPU
# after another against a thread per GPU, peer access), and one run under strace.
# Usage (device): scripts/device/gpu_measure_profile.sh TOPORUN OUT [RUNS]
set -uo pipefail
T=$(readlink -f "$1") OUT=$(readlink -f "$2") RUNS=${3:-5}; mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
P=scripts/device/gpu_cuda_init_profile.py S=$OUT/measure-profile.txt
nvidia-smi --query-gpu=index,name,persistence_mode --format=csv > "$OUT/gpus.csv"
split() { python3 -c 'import json,sys; b=json.load(open(sys.argv[1]))["bandwidth"]; print(" ".join(f"{k}={v:.3f}" for k,v in sorted(b.items()) if k.endswith("seconds")))' "$1"; }
for vis in all 0,1; do
  for i in $(seq 1 "$RUNS"); do
    f=$OUT/measure-$vis-$i.json; s=$EPOCHREALTIME
    if [ $vis = all ]; then "$T" preflight --measure --format json > "$f"; else CUDA_VISIBLE_DEVICES=$vis "$T" preflight --measure --format json > "$f"; fi
    echo "preflight --measure ($vis) run $i: wall $(awk -v s=$s -v e=$EPOCHREALTIME 'BEGIN{printf "%.3f", e-s}') s; $(split "$f")" | tee -a "$S"
  done
done
for mode in init-only serial threads ctx-only no-host; do
  for i in 1 2 3; do echo "py $mode: $(python3 $P $mode 2>&1)" | tee -a "$S"; done
done
for vis in 0 0,1 0,1,2; do
  for i in 1 2; do echo "py init-only CUDA_VISIBLE_DEVICES=$vis: $(CUDA_VISIBLE_DEVICES=$vis python3 $P init-only 2>&1)" | tee -a "$S"; done
done
if command -v strace > /dev/null; then
  strace -f -tt -T -o "$OUT/strace.txt" "$T" preflight --measure --format json > /dev/null 2>&1
  strace -f -c -o "$OUT/strace-summary.txt" "$T" preflight --measure --format json > /dev/null 2>&1
  gzip -f "$OUT/strace.txt"
else
  echo "no strace" >> "$S"
fi
