#!/usr/bin/env bash
# Hangs judged across nodes, on a machine of one GPU: two toporun nodes (NODES) on
# loopback, one rank each, all on GPU 0, NCCL_HOSTID per node with P2P and SHM off, so that
# NCCL takes them for two hosts and talks over sockets. Stages (STAGES), each written
# to OUT/summary.txt as it goes, each node's counters at the attempt's end kept
# (NAME/nccl-counters0, 1, gzipped):
#   cjob-healthy  scripts/device/nccl_c_job.cu (NCCL alone, --no-python), SECS s,
#                 --hang-timeout 15: no stack reads on any node, nothing to say
#   cjob-stuck    the same, rank 1 stuck in a read before step 200, --hang-timeout 15
#                 --on-hang stop: named from the counters alone, the job stopped
#   eval          scripts/device/gpu_profiler_hang_rank.py CASE=eval: rank 1 evaluates
#                 alone for 35 s (Python and GPU work) while rank 0 waits in an
#                 all_reduce, --hang-timeout 15 --on-hang stop: no hang, exit 0; both
#                 nodes' counters copied at 26 s and 34 s (at26/, at34/)
#   eval-nostragglers  the same under --stragglers off (no NVML samples of the GPUs):
#                 said once as not read, nothing stopped, exit 0
#   lightning-F, hf-F  scripts/device/gpu_trainer_{lightning,hf}.py with FAULT=F (raise,
#                 stop, skip, ...: scripts/device/trainer_common.py) on rank 1 at step
#                 30, --hang-timeout 15 --on-hang stop, then under torchrun (killed at
#                 TORCHRUN_LIMIT, 55 s) for the same fault
#                 (TORCHRUN_LIMIT=0: toporun only)
#   pipeline      scripts/device/gpu_trainer_pipeline.py, 2 stages, SECS s, healthy
#                 under the defaults: nothing to say
#   healthy-T     scripts/device/gpu_trainer_T.py (fsdp2, lightning, hf, ...) healthy
#                 under the defaults for SECS s: nothing to say
#   hsdp-healthy  scripts/device/gpu_trainer_fsdp2.py with MESH=2x2 on 4 nodes (each
#                 rank in a shard and a replicate communicator), SECS s, defaults:
#                 nothing to say
#   hsdp-slow     the same with rank 3 sleeping SLOW_MS (150) before each step: the
#                 straggler named is rank 3, from its wait in one communicator
#   hsdp-slowgpu  the same with rank 3's GPU running SLOW_GPU_MS (150) more work a step
#                 (matmuls queued before it; its host does not wait): rank 3 named
#   failure-C     scripts/device/gpu_nccl_failure_rank.py CASE=C (sidebusy, sysexit,
#                 skipgrad, ...) on rank 1 at step 12, --hang-timeout 15 --on-hang stop
#                 and EXTRA_ARGS (e.g. --nccl-profiler off: the stacks decide)
# With OLD=path/to/an/older/toporun each stage runs with it too (the build before).
# Both ranks share one GPU: its utilization is the two ranks' together, so a rank
# spinning in Python beside a waiting rank's NCCL kernel reads as busy here; on real
# nodes each rank's GPU is its own (the spin case is left to machines of 2+ GPUs).
# Usage (device): scripts/device/gpu_cross_node_hang.sh TOPORUN OUT
set -uo pipefail
T=$(readlink -f "$1") RESULTS=$(readlink -f "$2")
SECS=${SECS:-60} STAGES=${STAGES:-cjob-healthy cjob-stuck eval}
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CUDA_VISIBLE_DEVICES=0 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo
mkdir -p "$RESULTS"
S=$RESULTS/summary.txt
lines() { grep -E "hold:|fault:|toporun: (root cause|hang|no hang|straggler|warning|links|exit code|stopped|error|the ranks|rank [0-9]+ (is|was|exited|failed))|Root Cause|exitcode|traceback :|SignalException|Segmentation|SIGSEGV|core dumped" "$1" | cut -c1-1500 | head -30; }

two_nodes() {  # NAME LAUNCHER LIMIT ARGS...: NODES (2) nodes of one job, each timed
  local name=$1 t=$2 limit=$3 d=$RESULTS/$1 p=$((29700 + RANDOM % 200)) n=${NODES:-2} k; shift 3; mkdir -p "$d"
  local args=(--nnodes=$n --master-addr=127.0.0.1 --master-port=$p --nproc-per-node=1) pids=()
  for k in $(seq 0 $((n - 1))); do
    local logs=(--log-dir "$d/run$k"); [ "$t" = torchrun ] && logs=()
    NCCL_HOSTID=node$k python3 scripts/device/timed_run.py "$limit" "$d/stdout$k" "$d/stderr$k" "$t" --node-rank=$k "${args[@]}" "${logs[@]}" "$@" > "$d/exit$k" &
    pids+=($!)
  done
  wait "${pids[@]}"
  echo "== $name: $(for k in $(seq 0 $((n - 1))); do printf 'node %s %s; ' $k "$(cat "$d/exit$k")"; done)" | tee -a "$S"
  for k in $(seq 0 $((n - 1))); do
    echo "  node $k:" | tee -a "$S"; lines "$d/stderr$k" | tee -a "$S"
    cp "$d"/run$k/*/attempt_0/hang*.json "$d/" 2>/dev/null
    cp -r "$d"/run$k/*/attempt_0/nccl-counters "$d/nccl-counters$k" 2>/dev/null && gzip -f "$d/nccl-counters$k"/rank_*
    rm -rf "$d/run$k"
  done
}

snapshots() {  # DIR SECONDS...: every node's counters as the plugin wrote them, at each time
  local d=$1 at; shift
  for at in "$@"; do
    (sleep "$at"; mkdir -p "$d/at$at"
     for f in /dev/shm/toporun-*/attempt_0/rank_*; do
       gzip -c "$f" > "$d/at$at/$(basename "$f").gz"
     done) &
  done
}

cjob_bin() {
  local nccl bin=/tmp/nccl_c_job
  [ -x $bin ] && { echo $bin; return; }
  nccl=$(python3 -c "import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])")
  nvcc -O2 -o $bin scripts/device/nccl_c_job.cu -I"$nccl/include" -L"$nccl/lib" -l:libnccl.so.2 -Xlinker -rpath="$nccl/lib" > "$RESULTS/nvcc.txt" 2>&1
  echo $bin
}

stage() {  # NAME TOPORUN TAG
  local bin ids=/tmp/nccl_c_job_ids; mkdir -p $ids
  case $1 in
    cjob-healthy) bin=$(cjob_bin); ID_FILE=$ids/h-$RANDOM CASE=healthy RUN_S=$SECS two_nodes "$1$3" "$2" $((SECS + 60)) --no-python --hang-timeout 15 "$bin" ;;
    cjob-stuck) bin=$(cjob_bin); ID_FILE=$ids/s-$RANDOM CASE=stuck HOLD_RANK=1 HOLD_STEP=200 two_nodes "$1$3" "$2" 75 --no-python --hang-timeout 15 --on-hang stop "$bin" ;;
    eval-nostragglers)  # the same without the straggler watch: no GPU samples
      CASE=eval HOLD_RANK=1 EVAL_S=35 two_nodes "$1$3" "$2" 100 --hang-timeout 15 --on-hang stop --stragglers off scripts/device/gpu_profiler_hang_rank.py ;;
    eval)
      nvidia-smi --query-gpu=timestamp,index,utilization.gpu --format=csv,noheader -lms 500 > "$RESULTS/gpu-util-eval$3.csv" 2>/dev/null &
      local smi=$! at
      # Both nodes' counters as the plugin wrote them (on /dev/shm) twice in the stall
      # (the evaluation starts at about 20 s and ends at about 55 s).
      for at in 26 34; do
        (sleep $at; mkdir -p "$RESULTS/eval$3/at$at"
         for f in /dev/shm/toporun-*/attempt_0/rank_*; do gzip -c "$f" > "$RESULTS/eval$3/at$at/$(basename "$f").gz"; done) &
      done
      CASE=eval HOLD_RANK=1 EVAL_S=35 two_nodes "$1$3" "$2" 100 --hang-timeout 15 --on-hang stop scripts/device/gpu_profiler_hang_rank.py
      kill $smi 2>/dev/null ;;
    lightning-*|hf-*)  # a real trainer's fault on rank 1 at step 30, toporun then torchrun
      local tr=${1%%-*} f=${1#*-}; [ "$tr" = lightning ] || tr=hf
      FAULT=$f two_nodes "$1$3" "$2" 75 --hang-timeout 15 --on-hang stop "scripts/device/gpu_trainer_$tr.py"
      [ -z "$3" ] && [ "${TORCHRUN_LIMIT:-55}" != 0 ] && FAULT=$f two_nodes "$1-torchrun" torchrun "${TORCHRUN_LIMIT:-55}" "scripts/device/gpu_trainer_$tr.py" ;;
    healthy-*)  # a real trainer healthy under the defaults for SECS s: nothing to say
      SECS=$SECS two_nodes "$1$3" "$2" $((SECS + 60)) "scripts/device/gpu_trainer_${1#healthy-}.py" ;;
    hsdp-*)  # FSDP2 over a 2x2 mesh on 4 nodes (a shard and a replicate communicator a
      # rank, and the job's), under the defaults; -slow: rank 3 sleeps before each
      # step, -slowgpu: its GPU runs more work a step
      local slow=0 slowgpu=0; [ "$1" = hsdp-slow ] && slow=${SLOW_MS:-150}
      [ "$1" = hsdp-slowgpu ] && slowgpu=${SLOW_GPU_MS:-150}
      snapshots "$RESULTS/$1$3" 50 80
      NODES=4 MESH=2x2 SECS=$SECS N_LAYER=4 DIM=512 BATCH=4 SEQ=256 SLOW_RANK=3 SLOW_MS=$slow SLOW_GPU_MS=$slowgpu two_nodes "$1$3" "$2" $((SECS + 60)) scripts/device/gpu_trainer_fsdp2.py ;;
    failure-*)  # a failure of the NCCL corpus across the two nodes
      # shellcheck disable=SC2086
      CASE=${1#failure-} two_nodes "$1$3" "$2" 90 --hang-timeout 15 --on-hang stop ${EXTRA_ARGS:-} scripts/device/gpu_nccl_failure_rank.py ;;
    pipeline)  # healthy, under the defaults: stages 0 and 1 send and receive across nodes
      SECS=$SECS two_nodes "pipeline$3" "$2" $((SECS + 40)) scripts/device/gpu_trainer_pipeline.py ;;
  esac
}

install() {  # the trainers' wheels carried in .whl where the machine lacks them
  python3 -c "import transformers, pytorch_lightning, accelerate" 2>/dev/null \
    || python3 -m pip install --no-index --find-links .whl transformers accelerate pytorch-lightning > "$RESULTS/install.txt" 2>&1
  echo "== trainers: $(python3 -c "import transformers, pytorch_lightning, torch; print('transformers', transformers.__version__, 'lightning', pytorch_lightning.__version__, 'torch', torch.__version__)" 2>&1 | tail -1)" | tee -a "$S"
}

nvidia-smi -L | tee -a "$S"
case " $STAGES " in *" lightning-"*|*" hf-"*|*" healthy-"*|*" pipeline "*) install ;; esac
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
for s in $STAGES; do
  stage "$s" "$T" ""
  [ -n "${OLD:-}" ] && stage "$s" "$(readlink -f "$OLD")" "-old"
done
