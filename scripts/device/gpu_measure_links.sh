#!/usr/bin/env bash
# Runs on a GPU machine: `toporun preflight --measure` beside PyTorch's copy benchmark
# (scripts/bench/copy_bench.py) in one command, their wall times beside nvidia-smi's, the
# live probe (NVML health included) saved as a facts fixture, and a comparison of every
# figure (toporun within 10% of PyTorch). Writes OUTDIR/{probe.json,measure-N.json,
# torch-N.json,times.txt,compare.txt}.
# Usage: bash scripts/device/gpu_measure_links.sh path/to/toporun OUTDIR [RUNS]
set -u
T=$(readlink -f "$1"); OUT=$2; RUNS=${3:-3}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
PY=${PYTHON:-python3}
# wall FILE CMD...: runs CMD with stdout to FILE; prints its wall time and exit code.
wall() { local f=$1; shift; local s=$EPOCHREALTIME; "$@" > "$f"; local rc=$?
  awk -v s="$s" -v e="$EPOCHREALTIME" -v rc=$rc 'BEGIN { printf "%.3f s rc=%d\n", e - s, rc }'; }
nvidia-smi --query-gpu=index,name,pci.bus_id,pcie.link.gen.max,pcie.link.width.max,persistence_mode --format=csv > "$OUT/gpus.csv"
{
  echo "nvidia-smi topo -m: $(wall "$OUT/topo.txt" nvidia-smi topo -m)"
  echo "nvidia-smi -q: $(wall /dev/null nvidia-smi -q)"
  echo "toporun probe: $(wall "$OUT/probe.json" "$T" probe --format json)"
  echo "toporun preflight: $(wall "$OUT/preflight.txt" "$T" preflight)"
  for i in $(seq 1 "$RUNS"); do
    echo "toporun preflight --measure run $i: $(wall "$OUT/measure-$i.json" "$T" preflight --measure --format json)"
    echo "torch copy_bench run $i: $(wall "$OUT/torch-$i.json" $PY scripts/bench/copy_bench.py)"
  done
} 2>&1 | tee "$OUT/times.txt"
"$T" preflight --measure > "$OUT/preflight-measure.txt"
$PY - "$OUT" "$RUNS" <<'PY' | tee "$OUT/compare.txt"
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
tp = [json.load(open(f"{out}/measure-{i}.json"))["bandwidth"] for i in range(1, runs + 1)]
pt = [json.load(open(f"{out}/torch-{i}.json")) for i in range(1, runs + 1)]
print("toporun: driver", tp[0].get("cuda_driver"), "error", tp[0].get("error"))
print("wall (s) toporun measure:", [round(t["seconds"], 3) for t in tp], "of which CUDA init", [round(t["init_seconds"], 3) for t in tp])
print("wall (s) torch in-process:", [t["seconds"] for t in pt], "of which import+init", [t["init_seconds"] for t in pt])
med = lambda xs: statistics.median(xs)
worst = 0.0
def row(name, a, b):
    global worst
    r = a / b
    worst = max(worst, abs(r - 1))
    print(f"{name:<18} toporun {a:8.1f} GB/s  torch {b:8.1f} GB/s  ratio {r:.3f}")
# Between GPUs the link's figure is torch's bulk copy (copy_bench.py says why); the
# per-copy figure, with PyTorch's cross-device ordering in each copy, is shown beside it.
for i, p in enumerate(tp[0]["pairs"]):
    per_copy = med([t["pairs"][i]["gbps"] for t in pt])
    row(f"GPU{p['src']}->GPU{p['dst']}", med([t["pairs"][i]["gbps"] for t in tp]), med([t["pairs"][i].get("bulk_gbps", per_copy) for t in pt]))
    print(f"{'':<18} torch per 64 MiB .to(): {per_copy:8.1f} GB/s (ordering cost per copy included)")
for i, h in enumerate(tp[0]["host"]):
    row(f"GPU{h['gpu']} h2d", med([t["host"][i]["h2d_gbps"] for t in tp]), med([t["host"][i]["h2d_gbps"] for t in pt]))
    row(f"GPU{h['gpu']} d2h", med([t["host"][i]["d2h_gbps"] for t in tp]), med([t["host"][i]["d2h_gbps"] for t in pt]))
print(f"largest deviation from torch: {worst * 100:.1f}% ({'within' if worst <= 0.10 else 'OUTSIDE'} 10%)")
PY
