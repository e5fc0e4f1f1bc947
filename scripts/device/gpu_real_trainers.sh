#!/usr/bin/env bash
# Issue 61 on a GPU machine: real trainers (scripts/device/gpu_trainer_*.py and the
# nanoGPT-style gpu_ddp_gpt_rank.py) under toporun's defaults, and broken the ways real
# jobs break, beside torchrun. Stages (STAGES), each written to OUT/summary.txt as it goes:
#   install  the wheels carried in .whl (Transformers, accelerate, Lightning and what
#            they need beyond torch; made by scripts/dev/trainer_wheels.sh)
#   healthy  each of TRAINERS on NPROC GPUs for SECS s under the defaults: any toporun
#            warning, and the iteration medians
#   pairs    each of TRAINERS on 2 GPUs, two runs at once on GPUs 0,1 and 2,3: toporun
#            beside torchrun (PAIR_B=toporun: two trainers under toporun at once)
#   healthy2 TRAINERS two at a time on 2 GPUs each under toporun's defaults (GPUs 0,1
#            and 2,3 at once), SECS s each: any toporun warning, the iteration medians
#   cost2    each of TRAINERS on 2 GPUs, toporun and torchrun at once on GPUs 0,1 and
#            2,3, RUNS (3) rounds of SECS s, the pairs swapped each round: iteration
#            medians of each side in each round
#   twofaults  the two faults of TWO_FAULTS on FAULT_TRAINERS' first under toporun at
#            once, on GPUs 0,1 and 2,3 (no torchrun beside)
#   faults   each FAULT of FAULTS on each of FAULT_TRAINERS, 2 ranks, rank 1 at step 30:
#            toporun (--hang-timeout 15 --on-hang stop) on GPUs 0,1 beside torchrun on
#            GPUs 2,3 (killed at TORCHRUN_LIMIT s if it is still running)
# Usage (device): scripts/device/gpu_real_trainers.sh TOPORUN OUT  (PACK=FILE.tgz packs OUT)
set -uo pipefail
T=$(readlink -f "$1") RESULTS=$(readlink -f "$2")
NPROC=${NPROC:-4} SECS=${SECS:-125} TRAINERS=${TRAINERS:-gpt lightning hf fsdp2 pipeline}
FAULTS=${FAULTS:-kill stop raise exit dlworker skip noinit} FAULT_TRAINERS=${FAULT_TRAINERS:-lightning hf}
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$RESULTS"
S=$RESULTS/summary.txt
lines() { grep -E "toporun: (root cause|hang|no hang|straggler|warning|links|exit code|stopped|error|the ranks|rank [0-9]+ (is|was|exited|failed))|Root Cause|exitcode|traceback :|Error|SignalException|Segmentation|core dumped" "$1" | grep -v "^\s*$" | cut -c1-900 | head -40; }
script() { case $1 in gpt) echo scripts/device/gpu_ddp_gpt_rank.py ;; *) echo "scripts/device/gpu_trainer_$1.py" ;; esac; }
iters() { grep -ho "median [0-9.]* ms over [0-9]* (rank [0-9]*" "$@" 2>/dev/null | awk '{printf "%s%s", sep, $2; sep=" "} END {print " ms"}'; }
keep() {  # DIR: the attempt's reports kept, the run directory removed
  local a; a=$(ls -d "$1"/run/*/attempt_0 2>/dev/null | head -1)
  [ -n "$a" ] && cp "$a"/*.json "$1/" 2>/dev/null && cp -r "$a/nccl-counters" "$1/" 2>/dev/null
  rm -rf "$1/run"
}
one() {  # NAME GPUS WHO LIMIT SCRIPT [LAUNCHER ARGS...]: a run; prints its summary lines
  local name=$1 gpus=$2 who=$3 limit=$4 sc=$5 d=$RESULTS/$1; shift 5; mkdir -p "$d"
  local cmd=(torchrun); [ "$who" = toporun ] && cmd=("$T" --log-dir "$d/run")
  local r; r=$(CUDA_VISIBLE_DEVICES=$gpus python3 scripts/device/timed_run.py "$limit" "$d/stdout" "$d/stderr" "${cmd[@]}" --standalone --nproc-per-node="$NPROC" "$@" "$sc")
  { echo "== $name ($who, GPUs $gpus): $r; iter medians: $(iters "$d/stdout" "$d/stderr")"; lines "$d/stderr"; } > "$d/summary.txt"
  keep "$d"
}

stage_install() {
  python3 -c "import transformers, pytorch_lightning, accelerate" 2>/dev/null \
    || python3 -m pip install --no-index --find-links .whl transformers accelerate pytorch-lightning > "$RESULTS/install.txt" 2>&1
  echo "== install: $(python3 -c "import transformers, pytorch_lightning, accelerate, torch; print('transformers', transformers.__version__, 'lightning', pytorch_lightning.__version__, 'accelerate', accelerate.__version__, 'torch', torch.__version__)" 2>&1 | tail -1)" | tee -a "$S"
}

stage_healthy() {
  local all; all=$(seq -s, 0 $((NPROC - 1)))
  for t in $TRAINERS; do
    SECS=$SECS one "healthy$NPROC-$t" "$all" toporun $((SECS + 120)) "$(script "$t")"
    tee -a "$S" < "$RESULTS/healthy$NPROC-$t/summary.txt"
  done
}

stage_pairs() {
  local b=${PAIR_B:-torchrun}
  for t in $TRAINERS; do
    SECS=$SECS NPROC=2 one "pair-$t-toporun" 0,1 toporun $((SECS + 120)) "$(script "$t")" &
    SECS=$SECS NPROC=2 one "pair-$t-$b" 2,3 "$b" $((SECS + 120)) "$(script "$t")"
    wait
    cat "$RESULTS/pair-$t-toporun/summary.txt" "$RESULTS/pair-$t-$b/summary.txt" | tee -a "$S"
  done
}

stage_healthy2() {
  set -- $TRAINERS
  while [ $# -gt 0 ]; do
    SECS=$SECS NPROC=2 one "healthy2-$1" 0,1 toporun $((SECS + 120)) "$(script "$1")" &
    [ $# -gt 1 ] && SECS=$SECS NPROC=2 one "healthy2-$2" 2,3 toporun $((SECS + 120)) "$(script "$2")"
    wait
    cat "$RESULTS/healthy2-$1/summary.txt" | tee -a "$S"
    [ $# -gt 1 ] && tee -a "$S" < "$RESULTS/healthy2-$2/summary.txt" && shift
    shift
  done
}

stage_cost2() {
  local pairs=(0,1 2,3) i a b
  for t in $TRAINERS; do
    for i in $(seq 1 "${RUNS:-3}"); do
      a=${pairs[$((i % 2))]} b=${pairs[$(((i + 1) % 2))]}
      SECS=$SECS NPROC=2 one "cost2-$t-toporun-$i" "$a" toporun $((SECS + 90)) "$(script "$t")" &
      SECS=$SECS NPROC=2 one "cost2-$t-torchrun-$i" "$b" torchrun $((SECS + 90)) "$(script "$t")"
      wait
      echo "cost2 $t round $i: toporun (GPUs $a) $(iters "$RESULTS/cost2-$t-toporun-$i"/std*); torchrun (GPUs $b) $(iters "$RESULTS/cost2-$t-torchrun-$i"/std*); toporun lines: $(grep -c 'toporun: \(warning\|straggler\|links\|hang\)' "$RESULTS/cost2-$t-toporun-$i/stderr")" | tee -a "$S"
    done
  done
}

stage_faults() {
  for t in $FAULT_TRAINERS; do
    for f in $FAULTS; do
      FAULT=$f SECS=60 NPROC=2 one "fault-$t-$f-toporun" 0,1 toporun 120 "$(script "$t")" --hang-timeout 15 --on-hang stop &
      FAULT=$f SECS=60 NPROC=2 one "fault-$t-$f-torchrun" 2,3 torchrun "${TORCHRUN_LIMIT:-50}" "$(script "$t")"
      wait
      cat "$RESULTS/fault-$t-$f-toporun/summary.txt" "$RESULTS/fault-$t-$f-torchrun/summary.txt" | tee -a "$S"
    done
  done
}

stage_twofaults() {  # two faults of FAULT_TRAINERS' first under toporun at once: TWO_FAULTS on GPUs 0,1 and 2,3
  local t=${FAULT_TRAINERS%% *} f1 f2; read -r f1 f2 <<< "${TWO_FAULTS:-skip stop}"
  FAULT=$f1 SECS=60 NPROC=2 one "fault-$t-$f1-toporun" 0,1 toporun 120 "$(script "$t")" --hang-timeout 15 --on-hang stop &
  FAULT=$f2 SECS=60 NPROC=2 one "fault-$t-$f2-toporun" 2,3 toporun 120 "$(script "$t")" --hang-timeout 15 --on-hang stop
  wait
  cat "$RESULTS/fault-$t-$f1-toporun/summary.txt" "$RESULTS/fault-$t-$f2-toporun/summary.txt" | tee -a "$S"
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$S"
for s in ${STAGES:-install healthy}; do
  "stage_$s"
  [ -n "${PACK:-}" ] && tar czf "$PACK" -C "$(dirname "$RESULTS")" "$(basename "$RESULTS")"
done
