#!/usr/bin/env bash
# Issue 63 on a GPU machine: the NCCL profiler plugin never harms a job, and judges
# NCCL programs without Python. Stages (STAGES), each written to OUT/summary.txt as it
# goes, the runs' files kept under OUT/<stage>/:
#   dryrun   launch --dry-run: where the counters go (a memory file system)
#   cjob     scripts/device/nccl_c_job.cu on NCCL alone, NPROC ranks, --no-python:
#            healthy (SECS s, the defaults), rank 1 stuck in a read before step 200
#            (--hang-timeout 15 --on-hang stop), rank 1's GPU 3x slower (SECS s);
#            CJOB_CASES picks some
#   churn    scripts/device/gpu_comm_churn_rank.py CASE=churn: CYCLES cycles of
#            groups made, split to share a proxy, destroyed and aborted mid-collective
#   churnoff the same churn with --nccl-profiler off (the control)
#   many     the same script, CASE=many: 40 communicators live, rank 1 stuck in a read
#            (--hang-timeout 15 --on-hang stop)
# Usage (device): scripts/device/gpu_plugin_safety.sh TOPORUN OUT  (the plugin beside TOPORUN;
# PACK=FILE.tgz packs OUT into one file at the end)
set -uo pipefail
T=$(readlink -f "$1") RESULTS=$(readlink -f "$2")
NPROC=${NPROC:-2} SECS=${SECS:-90} CYCLES=${CYCLES:-300}
STAGES=${STAGES:-dryrun cjob churn many}
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$RESULTS"
S=$RESULTS/summary.txt
lines() { grep -E "hold:|churn:|many:|toporun: (root cause|hang|no hang|straggler|warning|links|exit code|stopped|error|the ranks)|Segmentation|SIGSEGV|core dumped|signal" "$1" | cut -c1-1200; }
keep() {  # DIR: the attempt's last counters and hang reports, then the run removed
  local a; a=$(ls -d "$1"/run/*/attempt_0 2>/dev/null | head -1); [ -n "$a" ] || return
  cp -r "$a/nccl-counters" "$1/" 2>/dev/null; cp "$a"/hang*.json "$1/" 2>/dev/null
  grep -lE "Segmentation fault|SIGSEGV|SIGBUS|core dumped" "$1/stderr" >/dev/null && echo "  A CRASH in $1" | tee -a "$S"
  echo "  counters files: $(ls "$1/nccl-counters" 2>/dev/null | tr '\n' ' ')" | tee -a "$S"
  rm -rf "$1/run"
}
run() {  # NAME LIMIT ARGS...: toporun ARGS, timed, its lines in the summary
  local name=$1 limit=$2 d=$RESULTS/$1; shift 2; mkdir -p "$d"
  echo "== $name: $(python3 scripts/device/timed_run.py "$limit" "$d/stdout" "$d/stderr" "$T" --log-dir "$d/run" "$@")" | tee -a "$S"
  lines "$d/stderr" | tee -a "$S"; lines "$d/stdout" | tee -a "$S"; keep "$d"
}

stage_dryrun() {
  local d=$RESULTS/dryrun; mkdir -p "$d"
  "$T" launch --dry-run --standalone --nproc-per-node="$NPROC" train.py > "$d/stdout" 2> "$d/stderr"
  echo "== dry run: exit $?" | tee -a "$S"
  grep -E "NCCL counters|TOPORUN_NCCL_COUNTERS|NCCL's own counters" "$d/stdout" | cut -c1-400 | tee -a "$S"
  df -h /dev/shm | tee -a "$S"
}

want() { case " ${CJOB_CASES:-healthy stuck slow} " in *" $1 "*) return 0 ;; esac; return 1; }

stage_cjob() {
  local nccl bin=/tmp/nccl_c_job ids=/tmp/nccl_c_job_ids; mkdir -p "$RESULTS/cjob" "$ids"
  nccl=$(python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))" 2>/dev/null || python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])")
  nvcc -O2 -o "$bin" scripts/device/nccl_c_job.cu -I"$nccl/include" -L"$nccl/lib" -l:libnccl.so.2 -Xlinker -rpath="$nccl/lib" > "$RESULTS/cjob/nvcc.txt" 2>&1 \
    || { echo "== cjob: nvcc failed"; cat "$RESULTS/cjob/nvcc.txt"; } | tee -a "$S"
  echo "== cjob: NCCL $(ls "$nccl/lib") from $nccl" | tee -a "$S"
  local common=(--standalone --nproc-per-node="$NPROC" --no-python)
  want healthy && ID_FILE=$ids/healthy-$RANDOM CASE=healthy RUN_S=$SECS run "cjob-healthy$NPROC" $((SECS + 60)) "${common[@]}" "$bin"
  want stuck && ID_FILE=$ids/stuck-$RANDOM CASE=stuck HOLD_RANK=1 HOLD_STEP=200 run "cjob-stuck$NPROC" 90 "${common[@]}" --hang-timeout 15 --on-hang stop "$bin"
  want slow && ID_FILE=$ids/slow-$RANDOM CASE=slow HOLD_RANK=1 RUN_S=$SECS run "cjob-slow$NPROC" $((SECS + 60)) "${common[@]}" "$bin"
}

stage_churn() {
  CASE=churn CYCLES=$CYCLES run "churn$NPROC" 400 --standalone --nproc-per-node="$NPROC" scripts/device/gpu_comm_churn_rank.py
}

stage_churnoff() {  # the same churn without the plugin: what NCCL and torch say of it alone
  CASE=churn CYCLES=$CYCLES run "churnoff$NPROC" 400 --standalone --nproc-per-node="$NPROC" --nccl-profiler off scripts/device/gpu_comm_churn_rank.py
}

stage_many() {
  CASE=many HOLD_RANK=1 run "many$NPROC" 150 --standalone --nproc-per-node="$NPROC" --hang-timeout 15 --on-hang stop scripts/device/gpu_comm_churn_rank.py
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$S"
for s in $STAGES; do "stage_$s"; done
# What comes back from a device machine is a few files: the whole results as one.
[ -n "${PACK:-}" ] && tar czf "$PACK" -C "$(dirname "$RESULTS")" "$(basename "$RESULTS")"
