#!/usr/bin/env bash
# Runs on a GPU machine: NVML health checks on real GPUs. A clean preflight; a GPU held
# by another process (a python holding a CUDA context) named by gpu.processes; and
# `--preflight-measure` before a real NCCL job, which must leave no context behind (the
# ranks then find the GPUs free). Writes OUTDIR/health.txt.
# Usage: bash scripts/device/gpu_health_check.sh path/to/toporun OUTDIR
set -u
T=$(readlink -f "$1"); OUT=$2; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
{
echo "== preflight, GPUs idle"
"$T" preflight | grep -E "gpu\.|fit"
echo "== preflight while another process holds GPU0"
$PY -c "import torch,time; x=torch.ones(1,device='cuda:0'); print('holder up', flush=True); time.sleep(60)" > /tmp/holder.txt 2>&1 &
H=$!
for i in $(seq 1 100); do grep -q "holder up" /tmp/holder.txt && break; sleep 0.2; done
"$T" preflight --format json | $PY -c "
import json, sys
d = json.load(sys.stdin)
for f in d['findings']:
    if f['id'] == 'gpu.processes':
        print(f['severity'], f['summary'])"
kill $H; wait $H 2>/dev/null
echo "== launch --preflight-measure, then a NCCL job on every GPU"
BENCH_MIB=64 "$T" --preflight-measure --standalone --nproc-per-node=gpu examples/allreduce_bench.py 2>&1 \
  | grep -E "bandwidth|RESULT|error|Traceback" | cut -c1-400
echo "job rc=${PIPESTATUS[0]}"
echo "== after the job: processes on the GPUs"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv
} 2>&1 | tee "$OUT/health.txt"
