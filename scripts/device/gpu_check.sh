#!/usr/bin/env bash
# Runs on a GPU machine with PyTorch (the lent H200 hosts): toporun probe/preflight vs
# nvidia-smi, NCCL all_reduce under torchrun, toporun, toporun-as-torchrun and the
# plan's environment, start-to-first-line timing, and two co-located static nodes.
# Usage: bash scripts/device/gpu_check.sh path/to/toporun OUTDIR
set -u
T=$(readlink -f "$1"); OUT=$2; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
B=examples/allreduce_bench.py
nvidia-smi topo -m > "$OUT/smi-topo.txt"
s=$(date +%s.%N); nvidia-smi topo -m > /dev/null; e=$(date +%s.%N); echo "nvidia-smi topo -m: $(python3 -c "print(round($e - $s, 3))") s" | tee "$OUT/timing.txt"
"$T" probe --format json > "$OUT/h200x4.json"
"$T" topo --format json > "$OUT/topo.json"
for i in 1 2 3 4 5; do s=$(date +%s.%N); "$T" preflight > "$OUT/preflight.txt"; rc=$?; e=$(date +%s.%N); echo "toporun preflight run $i: $(python3 -c "print(round($e - $s, 3))") s rc=$rc" | tee -a "$OUT/timing.txt"; done
cat "$OUT/preflight.txt"
"$T" launch --dry-run --nproc-per-node=gpu $B > "$OUT/dry-run.txt"
"$T" launch --dry-run --format env --nproc-per-node=gpu $B > "$OUT/plan.env"; cat "$OUT/plan.env"
NCCL_P2P_DISABLE=1 NCCL_PROTO=Simple NCCL_P2P_DIRECT_WRITE=1 "$T" launch --dry-run --nproc-per-node=gpu $B 2>&1 | sed -n '/findings/,/NCCL plan/p' > "$OUT/harmful-warnings.txt"
run() { tag=$1; shift; ( PROBE_TAG=$tag timeout 300 "$@" 2>&1 | grep -E "RESULT|Error|error" | head -5 ) | tee -a "$OUT/results.txt"; }
run torchrun-default torchrun --standalone --nproc-per-node=4 $B
run toporun-default "$T" --standalone --nproc-per-node=gpu $B
ln -sf "$T" /tmp/torchrun; run toporun-as-torchrun /tmp/torchrun --standalone --nproc-per-node=4 $B
( set -a; . "$OUT/plan.env"; set +a; run toporun-plan "$T" --standalone --nproc-per-node=4 $B )
cat > /tmp/first.py <<'PY'
import time, os, sys
print("first", os.environ["LOCAL_RANK"], time.time(), flush=True)
PY
for i in 1 2 3; do s=$(date +%s.%N); "$T" --standalone --nproc-per-node=4 /tmp/first.py | sort -k3 | head -1 | awk -v s=$s '{printf "toporun start->first line: %.3f s\n", $3-s}' | tee -a "$OUT/timing.txt"; done
for i in 1 2 3; do s=$(date +%s.%N); torchrun --standalone --nproc-per-node=4 /tmp/first.py 2>/dev/null | sort -k3 | head -1 | awk -v s=$s '{printf "torchrun start->first line: %.3f s\n", $3-s}' | tee -a "$OUT/timing.txt"; done
# Two static nodes of 2 GPUs in one container.
P=29533
CUDA_VISIBLE_DEVICES=0,1 NCCL_DEBUG=INFO PROBE_TAG=two-nodes "$T" --nnodes=2 --node-rank=0 --master-addr=127.0.0.1 --master-port=$P --nproc-per-node=2 $B > "$OUT/node0.log" 2>&1 &
CUDA_VISIBLE_DEVICES=2,3 NCCL_DEBUG=INFO PROBE_TAG=two-nodes "$T" --nnodes=2 --node-rank=1 --master-addr=127.0.0.1 --master-port=$P --nproc-per-node=2 $B > "$OUT/node1.log" 2>&1
wait
grep -E "RESULT|rdzv.colocated|nNodes|complete" "$OUT/node0.log" | head -8 | tee -a "$OUT/results.txt"
grep -E " via " "$OUT/node0.log" | sed 's/.*NCCL INFO //' | sort | uniq -c | sort -rn | head -5 | tee -a "$OUT/results.txt"
