#!/usr/bin/env bash
# On a lent GPU machine: the NVML probe (preflight) and, at a rank's failure, the GPUs'
# health read again without the topology (GpuProbe::health_now). A rank that raises
# after touching the GPU: toporun must name the code's exception, no hardware cause.
# Usage (device): scripts/device/gpu_failure_health.sh  (target/release/toporun carried)
set -uo pipefail
T=${TOPORUN:-target/release/toporun}
OUT=${OUT:-/tmp/gpu-failure-health}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
"$T" preflight --format json > "$OUT/preflight.json" 2> "$OUT/preflight.err"
echo "preflight exit $?" | tee "$OUT/summary.txt"
cat > /tmp/raise_on_gpu.py <<'PY'
import torch
x = torch.ones(1 << 20, device="cuda")
torch.cuda.synchronize()
raise ValueError(f"bad batch after {x.sum().item():.0f} on the GPU")
PY
start=$(date +%s.%N)
"$T" --standalone --nproc-per-node=1 --exit-codes=classified /tmp/raise_on_gpu.py > "$OUT/job.out" 2> "$OUT/job.err"
code=$?
end=$(date +%s.%N)
echo "job exit $code in $(python3 -c "print(round($end - $start, 2))") s" | tee -a "$OUT/summary.txt"
grep -E "root cause|degraded|exit code" "$OUT/job.err" | tee -a "$OUT/summary.txt"
