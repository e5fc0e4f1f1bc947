#!/usr/bin/env bash
# On a GPU machine, after the ranks' start moved to vfork_exec (issue 40): the CPU
# binding each rank gets, realistic NCCL failures' first causes, and the GPU
# straggler, with the given binary. Each stage's output is packed into OUT as it
# ends (OUT/STAGE.tgz), so a call cut short keeps what ran.
# Usage (device): scripts/device/gpu_spawn_check.sh TOPORUN OUT
set -uo pipefail
BIN=$(readlink -f "$1") OUT=$2
mkdir -p "$OUT" /tmp/spawn-check
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pack() { tar czf "$OUT/$1.tgz" -C /tmp/spawn-check "$1"; }
stage() {
  local name=$1; shift
  local s; s=$(date +%s)
  "$@" > "/tmp/spawn-check/$name.log" 2>&1
  echo "$name: rc=$? $(( $(date +%s) - s )) s" | tee -a "$OUT/stages.txt"
  mkdir -p "/tmp/spawn-check/$name"; mv "/tmp/spawn-check/$name.log" "/tmp/spawn-check/$name/"
  pack "$name"
}
stage numa bash scripts/device/gpu_numa_binding.sh "$BIN" /tmp/spawn-check/numa
stage failures env NPROC=2 bash scripts/device/gpu_nccl_failures.sh "$BIN" /tmp/spawn-check/failures leaver segv watchdog stuck
stage straggler env NPROC=2 JOBS=slow COST=none GRAPH_STAGE=0 LIMIT=135 bash scripts/device/gpu_straggler_proof.sh "$BIN" /tmp/spawn-check/straggler
