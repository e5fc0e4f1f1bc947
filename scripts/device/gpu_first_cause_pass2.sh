#!/usr/bin/env bash
# Issue 50 on a 4-GPU machine, stage by stage (STAGES, default all), each working in
# WORK (/tmp/pass2) and writing OUT/summary.txt as it goes and OUT/results.tgz (all of
# WORK) after each stage (the device returns 8 files):
#   dupgpu    2 ranks on one GPU: NCCL's invalid usage said with its reason and a fix
#   watchdog2 watchdog4  NCCL's watchdog at 25 s on 2 and 4 ranks: the job ends
#             within its timeout + 15 s (scripts/device/gpu_nccl_failures.sh's case)
#   pause     a healthy NVLink job, 16 MiB gradients, rank 1 busy 35 s on its CPU in
#             the middle: no slow-links warning; its sampled dumps kept
#   pauseslow the same with ~0.7 s steps (8192-wide matmuls x500): few collectives in
#             the dumps, the first (NCCL's connection) among them, as in the issue
#   backward2 backward4  DDP with a real backward, rank 1 on 3x the batch: the
#             straggler line names its backward; `toporun stacks` captured meanwhile
#   node1     two nodes on one host, CUDA_VISIBLE_DEVICES 0,1 and 2,3, global rank 3
#             (node 1's second GPU) on 3x the work: named with host GPU 3
# Usage (device): scripts/device/gpu_first_cause_pass2.sh TOPORUN OUT
set -uo pipefail
T=$(readlink -f "$1") RESULTS=$(readlink -f "$2") OUT=${WORK:-/tmp/pass2}
mkdir -p "$OUT" "$RESULTS"
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
S=$RESULTS/summary.txt
pack() { tar czf "$RESULTS/results.tgz.tmp" -C "$OUT" --exclude nccl-failures.tar.gz . && mv "$RESULTS/results.tgz.tmp" "$RESULTS/results.tgz"; }
lines() { grep -E "toporun: (root cause|hang|straggler|warning: slow|links|exit code|stopped|error)" "$1" | cut -c1-700; }
stacks_every() {  # DIR N: N captures of `toporun stacks --format json`, 3 s apart
  for i in $(seq 1 "$2"); do sleep 3; "$T" stacks --format json > "$1/stacks-$i.json" 2>&1; done
}
dupgpu() {
  local d=$OUT/dupgpu; mkdir -p "$d"
  echo "== dupgpu: $(python3 scripts/device/timed_run.py 60 "$d/stdout" "$d/stderr" "$T" --standalone --nproc-per-node=2 scripts/device/gpu_dup_gpu_rank.py)" | tee -a "$S"
  lines "$d/stderr" | tee -a "$S"
}
watchdog() {  # NPROC
  NPROC=$1 scripts/device/gpu_nccl_failures.sh "$T" "$OUT/watchdog$1" watchdog > /dev/null 2>&1
  echo "== watchdog on $1 ranks" | tee -a "$S"; cat "$OUT/watchdog$1/summary.txt" | tee -a "$S"
  lines "$OUT/watchdog$1/watchdog/stderr" | tee -a "$S"
}
pause() {  # NAME VAR=VALUE...
  local name=${1:-pause}; shift $(($# > 0)); local d=$OUT/$name; mkdir -p "$d"
  echo "== $name: $(env BUCKETS=1 BUCKET_MIB=16 WORK=8 SECS=75 PAUSE_RANK=1 PAUSE_AT=20 PAUSE_S=35 "$@" python3 scripts/device/timed_run.py 130 "$d/stdout" "$d/stderr" "$T" --standalone --nproc-per-node=2 --log-dir "$d/run" scripts/device/gpu_nccl_straggler_rank.py) $(cat "$d/stdout")" | tee -a "$S"
  lines "$d/stderr" | tee -a "$S"
  mkdir -p "$d/fr-sampled"; cp "$d"/run/*/attempt_0/fr-sampled/* "$d/fr-sampled/" 2>/dev/null
  grep -E "P2P|via" "$d/stderr" | head -3 >> "$S"; rm -rf "$d/run"
}
backward() {  # NPROC
  local d=$OUT/backward$1; mkdir -p "$d"
  stacks_every "$d" 20 & local s=$!
  echo "== backward on $1 ranks: $(SLOW_RANK=1 FACTOR=3 SECS=75 python3 scripts/device/timed_run.py 130 "$d/stdout" "$d/stderr" "$T" --standalone --nproc-per-node="$1" --straggler-window=30 scripts/device/gpu_backward_rank.py) $(cat "$d/stdout")" | tee -a "$S"
  wait $s; lines "$d/stderr" | tee -a "$S"
}
node1() {
  local d=$OUT/node1 P=29611; mkdir -p "$d"
  local args=(--nnodes=2 --master-addr=127.0.0.1 --master-port=$P --nproc-per-node=gpu --straggler-window=30 scripts/device/gpu_nccl_straggler_rank.py)
  SLOW_RANK=3 FACTOR=3 SECS=75 CUDA_VISIBLE_DEVICES=0,1 python3 scripts/device/timed_run.py 130 "$d/out0" "$d/err0" "$T" --node-rank=0 "${args[@]}" > "$d/exit0" &
  local n0=$!
  echo "== node1: $(SLOW_RANK=3 FACTOR=3 SECS=75 CUDA_VISIBLE_DEVICES=2,3 python3 scripts/device/timed_run.py 130 "$d/out1" "$d/err1" "$T" --node-rank=1 "${args[@]}") / node 0: $(wait $n0; cat "$d/exit0")" | tee -a "$S"
  lines "$d/err0" | sed 's/^/node0 /' | tee -a "$S"; lines "$d/err1" | sed 's/^/node1 /' | tee -a "$S"
}
nvidia-smi -L > "$OUT/gpus.txt" 2>&1; cp "$OUT/gpus.txt" "$RESULTS/"
for stage in ${STAGES:-dupgpu watchdog2 watchdog4 pause backward2 backward4 node1}; do
  case $stage in
    watchdog2) watchdog 2 ;; watchdog4) watchdog 4 ;;
    backward2) backward 2 ;; backward4) backward 4 ;;
    pauseslow) pause pauseslow SIZE=8192 WORK=500 ;;
    *) $stage ;;
  esac
  pack
done
