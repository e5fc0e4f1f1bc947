#!/usr/bin/env bash
# On a GPU machine: the CPU affinity each rank gets under --numa-binding, toporun
# against torchrun, for every mode both accept; and the GPUs' NUMA nodes as the
# kernel and nvidia-smi give them. Usage: scripts/device/gpu_numa_binding.sh BIN OUT
set -uo pipefail
BIN=$(readlink -f "$1") OUT=$2
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cat > /tmp/affinity.py <<'PY'
import os
cpus = sorted(os.sched_getaffinity(0))
print(f"rank {os.environ['LOCAL_RANK']}: {len(cpus)} cpus {cpus[0]}-{cpus[-1]}" if cpus else "none", flush=True)
PY
{
  echo "== host: $(nproc) cpus; numa nodes: $(ls -d /sys/devices/system/node/node* 2>/dev/null | wc -l)"
  for n in /sys/devices/system/node/node*; do echo "$(basename "$n"): $(cat "$n/cpulist")"; done
  nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader | while IFS=, read -r i bus; do
    b=$(echo "$bus" | tr 'A-F' 'a-f' | sed 's/^ *0000//; s/^/0000/')
    echo "GPU$i $bus numa_node=$(cat /sys/bus/pci/devices/"${b:4}"/numa_node 2>/dev/null || cat /sys/bus/pci/devices/"$b"/numa_node 2>/dev/null)"
  done
  nvidia-smi topo -m | head -5
  for mode in node socket exclusive core-complex; do
    for l in toporun torchrun; do
      if [ $l = toporun ]; then cmd=("$BIN"); else cmd=(torchrun); fi
      echo "-- $l --numa-binding=$mode"
      "${cmd[@]}" --standalone --nproc-per-node=gpu --numa-binding=$mode /tmp/affinity.py 2>&1 \
        | grep -E "^rank|rror|toporun: (warning|error)" | sort | cut -c1-300
    done
  done
} 2>&1 | tee "$OUT/summary.txt"
