#!/usr/bin/env bash
# Two toporun "nodes" of 2 GPUs each on one 4-GPU host: static and c10d rendezvous in
# one container (NCCL should see one host), and static with node 1 in its own UTS
# namespace (another hostname, like a second pod: NCCL should see two hosts).
# Usage: bash scripts/device/gpu_two_nodes.sh path/to/toporun OUTDIR
set -u
T=$(readlink -f "$1"); OUT=$2; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 NCCL_DEBUG=INFO
B=examples/allreduce_bench.py
summary() {
  tag=$1
  echo "== $tag" | tee -a "$OUT/summary.txt"
  grep -hE "RESULT|rdzv.colocated|complete:" "$OUT/$tag-node0.log" "$OUT/$tag-node1.log" | cut -c1-400 | tee -a "$OUT/summary.txt"
  grep -h "nNodes" "$OUT/$tag-node0.log" | sed 's/.*NCCL INFO //' | head -2 | tee -a "$OUT/summary.txt"
  # Transport between the two nodes' ranks: 1[1] -> 2[2] (global ranks 1 and 2).
  grep -hE " 1\[1\] -> 2\[|via " "$OUT/$tag-node0.log" "$OUT/$tag-node1.log" | grep -E "1\[1\] -> 2\[|3\[1\] -> 0\[" | sed 's/.*NCCL INFO //' | sort | uniq -c | sort -rn | head -3 | tee -a "$OUT/summary.txt"
}
P=29611
CUDA_VISIBLE_DEVICES=0,1 PROBE_TAG=static timeout 300 "$T" --nnodes=2 --node-rank=0 --master-addr=127.0.0.1 --master-port=$P --nproc-per-node=gpu $B > "$OUT/static-node0.log" 2>&1 &
CUDA_VISIBLE_DEVICES=2,3 PROBE_TAG=static timeout 300 "$T" --nnodes=2 --node-rank=1 --master-addr=127.0.0.1 --master-port=$P --nproc-per-node=gpu $B > "$OUT/static-node1.log" 2>&1
wait; summary static
P=29612
CUDA_VISIBLE_DEVICES=0,1 PROBE_TAG=c10d timeout 300 "$T" --nnodes=2 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:$P --rdzv-id=job --nproc-per-node=gpu $B > "$OUT/c10d-node0.log" 2>&1 &
sleep 0.5
CUDA_VISIBLE_DEVICES=2,3 PROBE_TAG=c10d timeout 300 "$T" --nnodes=2 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:$P --rdzv-id=job --nproc-per-node=gpu $B > "$OUT/c10d-node1.log" 2>&1
wait; summary c10d
P=29613
CUDA_VISIBLE_DEVICES=0,1 PROBE_TAG=pods timeout 300 "$T" --nnodes=2 --node-rank=0 --master-addr=127.0.0.1 --master-port=$P --nproc-per-node=gpu $B > "$OUT/pods-node0.log" 2>&1 &
CUDA_VISIBLE_DEVICES=2,3 PROBE_TAG=pods timeout 300 unshare --uts sh -c "hostname other-pod && exec '$T' --nnodes=2 --node-rank=1 --master-addr=127.0.0.1 --master-port=$P --nproc-per-node=gpu $B" > "$OUT/pods-node1.log" 2>&1
wait; summary pods
