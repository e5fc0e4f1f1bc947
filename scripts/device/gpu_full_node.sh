#!/usr/bin/env bash
# Issue 14's run on a whole GPU node (written for 8x H200; runs on any count, and says
# what it skipped): facts and preflight timed beside nvidia-smi, --measure beside
# PyTorch's copies; start to the first line of every rank, toporun vs torchrun; NCCL
# all_reduce busbw under NCCL's defaults, toporun's plan and the harmful settings
# toporun warns about; the live NCCL report on the whole node, and with the node split
# into two toporun nodes (one container; another hostname; another network namespace).
# Usage: bash scripts/device/gpu_full_node.sh path/to/toporun OUTDIR [PYROUTE2_WHEEL_DIR]
set -u
T=$(readlink -f "$1"); OUT=$(readlink -f "$2"); WHL=${3:-}
cd "$(dirname "$0")/../.."
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
B=examples/allreduce_bench.py
N=$(nvidia-smi -L | grep -c "^GPU")
S=$OUT/summary.txt
say() { echo "$*" | tee -a "$S"; }
say "== $N GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs)"

say "== 1. facts, preflight, --measure"
bash scripts/device/gpu_measure_links.sh "$T" "$OUT/measure" 5 > "$OUT/measure.log" 2>&1
cat "$OUT/measure/times.txt" "$OUT/measure/compare.txt" >> "$S"
cp "$OUT/measure/probe.json" "$OUT/host-${N}gpu.json"
grep -E "bandwidth|fit" "$OUT/measure/preflight-measure.txt" | cut -c1-600 >> "$S"

say "== 2. start to the first line of every rank, 5 runs each"
cat > /tmp/first.py <<'PY'
import time, os
print("first", os.environ["LOCAL_RANK"], time.time(), flush=True)
PY
first() {  # LABEL CMD...: seconds from start until the last of the N ranks printed
  local label=$1; shift; local s; s=$(date +%s.%N)
  "$@" --standalone --nproc-per-node=$N /tmp/first.py 2>/dev/null | awk -v s="$s" -v n=$N -v l="$label" \
    '$1=="first" {c++; if ($3>m) m=$3} END {printf "%s: %d of %d ranks, last first line %.3f s\n", l, c, n, m-s}'
}
for i in 1 2 3 4 5; do first toporun "$T" | tee -a "$S"; first torchrun torchrun | tee -a "$S"; done

say "== 3. all_reduce busbw: defaults, plan, harmful"
"$T" launch --dry-run --format env --nproc-per-node=gpu $B > "$OUT/plan.env"
cat "$OUT/plan.env" >> "$S"
NCCL_P2P_DISABLE=1 NCCL_PROTO=Simple "$T" launch --dry-run --nproc-per-node=gpu $B 2>&1 \
  | sed -n '/findings/,/NCCL plan/p' > "$OUT/harmful-warnings.txt"
cat "$OUT/harmful-warnings.txt" >> "$S"
bench() {  # TAG [VAR=VALUE...]: one toporun job, its RESULT line
  local tag=$1; shift
  env "$@" PROBE_TAG=$tag timeout 300 "$T" --standalone --nproc-per-node=$N $B 2>&1 \
    | grep -E "^RESULT|toporun: (warning|error)" | cut -c1-4000 | tee -a "$OUT/busbw.txt"
}
if [ "$N" -ge 2 ]; then
  # Alternating runs (BUSBW_RUNS of each): a size's figure is the median of the runs,
  # each run's own figure the median of its three trials (allreduce_bench.py).
  for r in $(seq 1 "${BUSBW_RUNS:-4}"); do
    bench default
    bench plan $(grep -v '^#' "$OUT/plan.env" | xargs)
  done
  bench p2p-off NCCL_P2P_DISABLE=1
  bench proto-simple NCCL_PROTO=Simple
  # busbw per size and tag (best of the runs), and plan / default.
  python3 scripts/bench/busbw_table.py "$OUT/busbw.txt" | tee -a "$S"
  grep "^RESULT" "$OUT/busbw.txt" >> "$S"
else
  say "skipped: all_reduce needs 2 GPUs or more (NCCL runs no transport on one)"
fi

say "== 4. live NCCL report: the whole node, then two toporun nodes"
BENCH_MIB=1024 PROBE_TAG=node timeout 300 "$T" --standalone --nproc-per-node=$N $B > "$OUT/node.log" 2>&1
grep -E "toporun: nccl|nccl.transport|^RESULT" "$OUT/node.log" | cut -c1-600 | tee -a "$S"
if [ "$N" -ge 2 ]; then
  H=$((N / 2)); A=$(seq -s, 0 $((H - 1))); Z=$(seq -s, $H $((N - 1)))
  split() { bash scripts/device/gpu_split_node.sh "$T" "$OUT" "$A" "$Z" "$@" | tee -a "$S"; }
  split same 29811 127.0.0.1
  split uts 29812 127.0.0.1
  split uts 29814 127.0.0.1 warn
  if [ -n "$WHL" ] && PYTHONPATH=$(ls "$WHL"/pyroute2-*.whl | head -1) python3 launcher/tests/scripts/netns.py up fullnode 10.78.0.1 10.78.0.2 >> "$S" 2>&1; then
    split net 29813 10.78.0.1
    split net 29815 10.78.0.1 warn
    PYTHONPATH=$(ls "$WHL"/pyroute2-*.whl | head -1) python3 launcher/tests/scripts/netns.py down fullnode >> "$S" 2>&1
  else
    say "skipped: split over network namespaces (needs the pyroute2 wheel dir, and root)"
  fi
else
  say "skipped: splitting the node needs 2 GPUs or more"
fi
