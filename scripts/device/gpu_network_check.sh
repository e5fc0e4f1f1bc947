#!/usr/bin/env bash
# The network check through NCCL (issue 64) on one GPU machine: three "nodes", each a
# toporun in a network namespace of its own on one bridge (eth0 in each, as in a pod),
# on the machine's GPUs in turn (one GPU shared where there is one), NCCL over sockets
# through the veths: NCCL_HOSTID per node so NCCL takes them for three hosts, P2P, SHM
# and IB off. Node 2's link is then shaped with tc (a token bucket, both ways).
# Runs (RUNS="static elastic" by default): static: unshaped (auto: through NCCL),
# shaped (auto), shaped over TCP between the agents (the fallback, for comparison),
# shaped under gate (every node exits 82); elastic: --nnodes 2:3 under gate with a
# fourth node as spare: node 2 refused (82), the spare joins round 1, whose check runs
# through NCCL again, and the job runs.
# Each node's log and network-check.json land under OUTDIR/<run>/.
# Usage: bash scripts/device/gpu_network_check.sh path/to/toporun OUTDIR PYROUTE2_WHEEL_DIR [MBIT [REPEAT]]
# (PYROUTE2_WHEEL_DIR: .whl, made by scripts/dev/trainer_wheels.sh)
# (REPEAT: unshaped runs, for the check's time and its spread)
set -u
T=$(readlink -f "$1"); OUT=$(readlink -f "$2"); WHL=$(ls "$3"/pyroute2-*.whl | head -1)
MBIT=${4:-100} REPEAT=${5:-1} RUNS=${RUNS:-static elastic}
mkdir -p "$OUT"; S=$OUT/summary.txt
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export N_LAYER=2 N_EMBD=256 N_HEAD=4 BLOCK=128 BATCH=4 ACCUM=1 SECS=2
bridge() { PYTHONPATH=$WHL python3 launcher/tests/scripts/netns_bridge.py "$@"; }
bridge up gnc 10.79.40 4 >> "$S" 2>&1 || { echo "netns setup failed" >> "$S"; exit 1; }
NG=$(nvidia-smi -L | wc -l)
{ echo "GPUs: $NG"; nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"; } >> "$S" 2>&1
# What the probe's start costs here: importing torch, then CUDA's context.
python3 - >> "$S" 2>&1 <<'EOF'
import time
t = time.perf_counter(); import torch, torch.distributed
a = time.perf_counter(); torch.zeros(1, device="cuda"); b = time.perf_counter()
print(f"probe start: import torch {a - t:.2f}s, CUDA context {b - a:.2f}s")
EOF

node() { # run name, namespace, toporun options...
  local tag=$1 i=$2; shift 2
  (
    CUDA_VISIBLE_DEVICES=$((i % NG)) NCCL_HOSTID=gnc-node$i NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \
    NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=eth0 GLOO_SOCKET_IFNAME=eth0 \
    timeout 240 nsenter --net=/run/netns/gnc$i "$T" --nproc-per-node=1 \
      --log-dir="$OUT/$tag/logs$i" "$@" scripts/device/gpu_ddp_gpt_rank.py
    echo "toporun exit $?"
  ) > "$OUT/$tag/node$i.log" 2>&1 &
}
job() { # run name, toporun options...
  local tag=$1; shift
  local port=$((29700 + RANDOM % 200)) start=$(date +%s.%N)
  mkdir -p "$OUT/$tag"
  for i in 0 1 2; do
    node "$tag" $i --nnodes=3 --node-rank=$i --master-addr=10.79.40.10 --master-port=$port "$@"
  done
  wait
  echo "== $tag ($*): $(awk "BEGIN{print $(date +%s.%N) - $start}") s" >> "$S"
  grep -hE "network check|network.slow_node|not through torch|torch probe|toporun exit|refused" "$OUT/$tag"/node*.log | cut -c1-700 | sort | uniq -c >> "$S"
  find "$OUT/$tag" -name network-check.json | head -1 | xargs -r cat >> "$S"; echo >> "$S"
}
elastic() {
  local tag=elastic-gate start=$(date +%s.%N)
  local a=(--nnodes=2:3 --rdzv-backend=c10d --rdzv-endpoint=10.79.40.10:$((29900 + RANDOM % 90))
    --rdzv-id=gpu$RANDOM --rdzv-conf=last_call_timeout=3,join_timeout=60 --network-check=gate)
  mkdir -p "$OUT/$tag"
  for i in 0 1 2; do node $tag $i "${a[@]}"; done
  sleep 2  # the spare comes once round 0 holds three nodes
  node $tag 3 "${a[@]}"
  wait
  echo "== $tag: $(awk "BEGIN{print $(date +%s.%N) - $start}") s" >> "$S"
  for i in 0 1 2 3; do
    echo "-- node $i" >> "$S"
    grep -hE "network check|refused|round [0-9]: this node|toporun exit" "$OUT/$tag/node$i.log" | cut -c1-400 >> "$S"
  done
}
case " $RUNS " in *" static "*)
  for k in $(seq 1 "$REPEAT"); do job unshaped$([ "$k" = 1 ] || echo "-$k") --network-check=report; done
esac
bridge shape gnc 2 "$MBIT" >> "$S" 2>&1
case " $RUNS " in *" static "*)
  job shaped --network-check=report
  job shaped-tcp --network-check=report --network-check-path=tcp
  job shaped-gate --network-check=gate
esac
case " $RUNS " in *" elastic "*) elastic ;; esac
bridge down gnc 4 >> "$S" 2>&1
