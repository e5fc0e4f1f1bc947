#!/usr/bin/env bash
# The NCCL evidence matrix on a 2-GPU host, with toporun's live report on: two toporun
# nodes of one GPU each, separated as pods would be (UTS, network namespace over a
# veth pair, IPC, private /dev with only the node's own GPU, own or shared /dev/shm),
# with --colocated warn and join; /dev/shm use of the SHM transport; the report's cost.
# Every run's console, NCCL files and report JSON land in OUT.
# Usage: bash scripts/device/gpu_nccl_evidence.sh path/to/toporun OUTDIR WHEEL_DIR
set -u
T=$(readlink -f "$1"); OUT=$(readlink -f "$2"); WHL=$(ls "$3"/pyroute2-*.whl | head -1)
cd "$(dirname "$0")/../.."
mkdir -p "$OUT/logs" "$OUT/runs"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 BENCH_MIB=${BENCH_MIB:-256,1024}
B=$(readlink -f "${BENCH_SCRIPT:-examples/allreduce_bench.py}")
S=$OUT/summary.txt
PORT=29700
PYTHONPATH=$WHL python3 launcher/tests/scripts/netns.py up trn 10.77.0.1 10.77.0.2 >> "$S" 2>&1 || echo "netns setup failed" >> "$S"

# node RANK KIND ARGS...: one toporun node on GPU RANK, separated by KIND.
node() {
  local r=$1 kind=$2; shift 2
  case "$kind" in
    same) CUDA_VISIBLE_DEVICES=$r "$T" "$@" ;;
    uts) CUDA_VISIBLE_DEVICES=$r unshare --uts sh -c 'hostname pod-1 && exec "$0" "$@"' "$T" "$@" ;;
    net) CUDA_VISIBLE_DEVICES=$r nsenter --net=/run/netns/trn "$T" "$@" ;;
    netuts) CUDA_VISIBLE_DEVICES=$r nsenter --net=/run/netns/trn unshare --uts sh -c 'hostname pod-1 && exec "$0" "$@"' "$T" "$@" ;;
    pod0-*) POD_GPU=$r POD_SHM=${kind#pod0-} unshare --mount --propagation private scripts/device/pod_dev.sh "$T" "$@" ;;
    pod-*) POD_GPU=$r POD_SHM=${kind#pod-} POD_HOSTNAME=pod-1 nsenter --net=/run/netns/trn unshare --uts --ipc --mount --propagation private scripts/device/pod_dev.sh "$T" "$@" ;;
  esac
}

# run2 TAG MODE KIND0 KIND1 [VAR=VALUE ...]; ONLY (a regex) picks the tags to run.
run2() {
  local tag=$1 mode=$2 k0=$3 k1=$4; shift 4
  [[ $tag =~ ${ONLY:-.} ]] || return 0
  PORT=$((PORT + 1))
  local master=127.0.0.1
  case "$k1" in net*|pod-*) master=10.77.0.1 ;; esac
  local args=(--nnodes=2 --master-addr=$master --master-port=$PORT --nproc-per-node=1 --colocated=$mode --rdzv-conf=join_timeout=60)
  ( export "$@" PROBE_TAG=$tag; timeout 150 bash -c "$(declare -f node); T=$T; node 0 $k0 \"\$@\"" _ --node-rank=0 "${args[@]}" --log-dir "$OUT/runs/$tag-0" "$B" > "$OUT/logs/$tag-node0.log" 2>&1 ) &
  local p0=$!
  ( export "$@" PROBE_TAG=$tag; timeout 150 bash -c "$(declare -f node); T=$T; node 1 $k1 \"\$@\"" _ --node-rank=1 "${args[@]}" --log-dir "$OUT/runs/$tag-1" "$B" > "$OUT/logs/$tag-node1.log" 2>&1 )
  local rc1=$?
  wait $p0; local rc0=$?
  {
    echo "== $tag: node 0 $k0, node 1 $k1, --colocated=$mode $* -> exit $rc0/$rc1"
    grep -hE "RESULT|toporun: nccl|rdzv.colocated|co-location:|NCCL failed|nccl.prediction|error|pod /dev" "$OUT/logs/$tag-node0.log" "$OUT/logs/$tag-node1.log" | cut -c1-300 | head -12
    grep -rhE "nNodes|via " "$OUT/runs/$tag-0" "$OUT/runs/$tag-1" 2>/dev/null | sed 's/^.*NCCL INFO //; s/Channel [0-9/]* : //; s/comm 0x[0-9a-f]* //' | sort | uniq -c | sort -rn | head -4
    grep -rh "NCCL WARN" "$OUT/runs/$tag-0" "$OUT/runs/$tag-1" 2>/dev/null | sed 's/^.*NCCL WARN/WARN/' | sort -u | head -3
  } >> "$S"
}

nvidia-smi -L >> "$S"
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())" >> "$S" 2>&1
# One container; then node 1 separated step by step, as rows of nccl-evidence.md.
run2 same warn same same
run2 uts-warn warn same uts
run2 uts-join join same uts
run2 net-warn warn same net
run2 net-cumem1 warn same net NCCL_CUMEM_ENABLE=1
run2 netuts-warn warn same netuts
run2 netuts-join join same netuts
run2 pod-shared-warn warn pod0-shared pod-shared
run2 pod-shared-join join pod0-shared pod-shared
run2 pod-own-join join pod0-own pod-own
run2 pod-shared-join-rwdev join pod0-shared pod-shared POD_DEV_RW=1

# /dev/shm use of the SHM transport with host buffers in files (2 local ranks).
[[ shm-use =~ ${ONLY:-.} ]] && PROBE_TAG=shm-use SHM_PROBE=1 BENCH_MIB=64 NCCL_P2P_DISABLE=1 NCCL_CUMEM_HOST_ENABLE=0 timeout 120 "$T" --standalone --nproc-per-node=2 "$B" > "$OUT/logs/shm-use.log" 2>&1
{ echo "== shm-use (P2P off, cuMem host off, 2 ranks)"; grep -hE "RESULT|toporun: nccl" "$OUT/logs/shm-use.log"; } >> "$S"

# The report's cost: init (init_process_group + first all_reduce) and busbw, on vs off, alternating.
for i in $(seq 1 "${COST_REPS:-6}"); do
  for r in on off; do
    PROBE_TAG=cost-$r BENCH_MIB=${COST_MIB:-256} timeout 120 "$T" --standalone --nproc-per-node=2 --nccl-report=$r "$B" > "$OUT/logs/cost-$r-$i.log" 2>&1
    grep -h RESULT "$OUT/logs/cost-$r-$i.log" >> "$OUT/cost.txt"
  done
done
[ -f "$OUT/cost.txt" ] && { echo "== report cost (on/off alternating, ${COST_REPS:-6} each)"; cat "$OUT/cost.txt"; } >> "$S"
PYTHONPATH=$WHL python3 launcher/tests/scripts/netns.py down trn
tar czf "$OUT/evidence.tgz" -C "$OUT" logs runs 2>/dev/null
rm -rf "$OUT/logs" "$OUT/runs"
cat "$S"
