#!/usr/bin/env bash
# Issue 37 on a 2-GPU machine (nvidia-h100-x2), one call: the full-node run (links
# against PyTorch's copies, start to first line against torchrun, busbw under NCCL's
# defaults / the plan / harmful settings, the live NCCL report whole and split, with
# --colocated join and warn), NVML Xid watching, --numa-binding against torchrun, and
# the NCCL version each source states. Writes OUT/pair-proof.tar.gz.
# Usage (device): bash scripts/device/gpu_pair_proof.sh BIN OUT [PYROUTE2_WHEEL_DIR]
set -uo pipefail
BIN=$(readlink -f "$1") OUT=$(readlink -f "$2") WHL=${3:-}
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=$OUT/pair-proof; mkdir -p "$D"
s=$SECONDS
{
  echo "torch: $(python3 -c 'import torch; print(torch.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())))')"
  python3 -m pip list 2>/dev/null | grep -i nccl
  ls -l "$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')"/lib/ | grep -i nccl
  ldconfig -p | grep -i nccl
  find / -xdev -name 'libnccl.so*' 2>/dev/null | head
  "$BIN" preflight 2>&1 | grep -i nccl
  "$BIN" launch --dry-run --nproc-per-node=gpu examples/allreduce_bench.py 2>&1 | grep -i "nccl [0-9]\|NCCL:\|nccl version" | head
} > "$D/nccl-version.txt" 2>&1
echo "nccl version done at $((SECONDS - s)) s"
bash scripts/device/gpu_full_node.sh "$BIN" "$D/full" "$WHL" > "$D/full.log" 2>&1
echo "full node done at $((SECONDS - s)) s"
bash scripts/device/gpu_xid_watch.sh "$BIN" "$D/xid" > "$D/xid.log" 2>&1
echo "xid done at $((SECONDS - s)) s"
bash scripts/device/gpu_numa_binding.sh "$BIN" "$D/numa" > "$D/numa.log" 2>&1
echo "numa done at $((SECONDS - s)) s"
tar czf "$OUT/pair-proof.tar.gz" -C "$OUT" pair-proof
cat "$D/nccl-version.txt" "$D/full/summary.txt" "$D/xid/summary.txt" "$D/numa/summary.txt" | cut -c1-400
