#!/usr/bin/env bash
# One GPU node split into two toporun nodes running examples/allreduce_bench.py (256 MiB):
# node 0 on GPUs A here, node 1 on GPUs Z separated by KIND (same: nothing; uts: another
# hostname; net: the network namespace `fullnode`, made by launcher/tests/scripts/netns.py), under
# --colocated=MODE. Logs in OUT/split-KIND-MODE-nodeN.log; prints each node's NCCL lines.
# Usage: scripts/device/gpu_split_node.sh TOPORUN OUT A Z KIND PORT ADDR [MODE]
set -u
T=$1 OUT=$2 A=$3 Z=$4 kind=$5 port=$6 addr=$7 mode=${8:-join}
B=examples/allreduce_bench.py pre=()
case "$kind" in
  uts) pre=(unshare --uts sh -c 'hostname other-pod && exec "$0" "$@"') ;;
  net) pre=(nsenter --net=/run/netns/fullnode) ;;
esac
BENCH_MIB=256 CUDA_VISIBLE_DEVICES=$A PROBE_TAG=$kind timeout 300 "$T" --nnodes=2 --node-rank=0 \
  --master-addr="$addr" --master-port="$port" --colocated="$mode" --nproc-per-node=gpu $B > "$OUT/split-$kind-$mode-node0.log" 2>&1 &
BENCH_MIB=256 CUDA_VISIBLE_DEVICES=$Z PROBE_TAG=$kind timeout 300 "${pre[@]}" "$T" --nnodes=2 --node-rank=1 \
  --master-addr="$addr" --master-port="$port" --colocated="$mode" --nproc-per-node=gpu $B > "$OUT/split-$kind-$mode-node1.log" 2>&1
wait
echo "-- split $kind --colocated=$mode (GPUs $A | $Z)"
for n in 0 1; do
  echo "node $n:"
  grep -hE "toporun: nccl|rdzv.colocated|nccl.transport|^RESULT" "$OUT/split-$kind-$mode-node$n.log" | cut -c1-600
done
