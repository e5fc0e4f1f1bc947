#!/usr/bin/env bash
# On a lent GPU machine: causes that need a real GPU, as a user meets them. A rank that
# asks CUDA for more memory than the GPU has (torch.OutOfMemoryError): toporun must
# lead with the gpu-memory cause, PyTorch's numbers and the user frame, exit 84 under
# --exit-codes classified. A rank that crashes in a native call after touching the GPU
# (SIGSEGV): the code cause names the function, no hardware cause.
# Usage (device): scripts/device/gpu_first_cause.sh  (target/release/toporun carried)
set -uo pipefail
T=${TOPORUN:-target/release/toporun}
OUT=${OUT:-/tmp/gpu-first-cause}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
cat > /tmp/oom_rank.py <<'PY'
import torch


def build_activations(n):
    free, total = torch.cuda.mem_get_info()
    keep = torch.empty(int(free * 0.8) // 4, device="cuda")  # most of the GPU, held
    return keep, torch.empty(n, device="cuda")  # then more than is left


build_activations(8 << 30)
PY
cat > /tmp/segv_rank.py <<'PY'
import ctypes
import torch

x = torch.ones(1 << 20, device="cuda")
torch.cuda.synchronize()


def decode_native_record(ptr):
    return ctypes.string_at(ptr, 8)


decode_native_record(8)
PY
for case in oom segv; do
  start=$(date +%s.%N)
  "$T" --standalone --nproc-per-node=1 --exit-codes=classified "/tmp/${case}_rank.py" > "$OUT/$case.out" 2> "$OUT/$case.err"
  code=$?
  end=$(date +%s.%N)
  echo "$case: exit $code in $(python3 -c "print(round($end - $start, 2))") s" | tee -a "$OUT/summary.txt"
  grep -E "^toporun: (root cause|exit code)|OutOfMemoryError|Fatal Python error" "$OUT/$case.err" | tee -a "$OUT/summary.txt"
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/summary.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$OUT/summary.txt"
