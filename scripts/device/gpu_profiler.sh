#!/usr/bin/env bash
# Issue 49 on a GPU machine: toporun's NCCL profiler plugin, stage by stage (STAGES),
# each in PROFILER_WORK (/tmp/profiler; not WORK, which the rank scripts read) and written to OUT/summary.txt as it goes and
# OUT/results.tgz (WORK, the ranks' counters files included) after each stage:
#   hang2 hang4      on 2 and 4 ranks, --hang-timeout HANG_TIMEOUT (20): rank 1 spins in Python
#                    (spin), blocks in a read (stuck), then rank 0 evaluates for 35 s
#                    (eval, --on-hang report: the job goes on; EVAL_ON_HANG=stop: it must
#                    go on anyway); CASES: which of them; each GPU's utilization kept
#   hang2x2          two toporun nodes of 2 ranks on one host (GPUs 0,1 and 2,3):
#                    rank 3, on node 1, spins (spin) or blocks in a read (stuck); the
#                    node hosting the store decides from both nodes' counters
#   straggler2 straggler4   60 s of training, rank 1 on 3x the matmuls (slow) and
#                    balanced; counters copied at 30 s and 50 s
#   cost             scripts/device/gpu_profiler_cost.sh: no plugin, every operation
#                    timed, the default sampling, alternating (sweep and training loops)
#   inproc           scripts/device/gpu_profiler_cost_inproc_rank.py on 4 ranks: the same
#                    variants switched inside each rank; needs BENCH_TOPORUN, a toporun
#                    with the plugin built with `--features bench-control` beside it
#                    (PASSES, SEGMENTS, STEPS, MIN_BYTES, MAX_BYTES, LOOPS: see the rank script;
#                    INPROC_TAG names the run's directory, inproc-TAG)
# Usage (device): scripts/device/gpu_profiler.sh TOPORUN OUT   (the plugin beside TOPORUN)
set -uo pipefail
T=$(readlink -f "$1") RESULTS=$(readlink -f "$2") OUT=${PROFILER_WORK:-/tmp/profiler}
mkdir -p "$OUT" "$RESULTS"
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
S=$RESULTS/summary.txt
pack() { tar czf "$RESULTS/results.tgz.tmp" -C "$OUT" . && mv "$RESULTS/results.tgz.tmp" "$RESULTS/results.tgz"; }
lines() { grep -E "hold:|toporun: (root cause|hang|no hang|straggler|warning|links|exit code|stopped|error)|deprecated" "$1" | cut -c1-900; }
counters() {  # DIR: posted/completed per communicator of each rank's counters file
  python3 - "$1" <<'PY'
import struct, sys, pathlib
for f in sorted(pathlib.Path(sys.argv[1]).glob("rank_*")):
    w = struct.unpack(f"<{len(f.read_bytes()) // 8}Q", f.read_bytes())
    slots = [(w[16 + s * 128 + 1], w[16 + s * 128 + 5], w[16 + s * 128 + 6], w[16 + s * 128 + 7]) for s in range(32) if w[16 + s * 128]]
    print(f"  {f.name}: " + "; ".join(f"comm {h:#x} posted {p} completed {c} busy {b / 1e9:.2f}s" for h, p, c, b in slots))
PY
}
keep() {  # DIR: the counters and what else the attempt left (fr dumps, hang.json)
  local a; a=$(ls -d "$1"/run/*/attempt_0 2>/dev/null | head -1); [ -n "$a" ] || return
  cp -r "$a/nccl-counters" "$1/" 2>/dev/null; cp "$a"/hang*.json "$1/" 2>/dev/null
  echo "  fr dumps: $(ls "$a/fr" 2>/dev/null | wc -l), sampled: $(ls "$a/fr-sampled" 2>/dev/null | wc -l), plugin log lines: $(cat "$1"/run/*/attempt_0/nccl/* 2>/dev/null | grep -c 'toporun profiler')" | tee -a "$S"
  counters "$1/nccl-counters" | tee -a "$S"
  rm -rf "$1/run"
}
hang() {  # NPROC CASE
  local d=$OUT/hang$1-$2 how=stop; mkdir -p "$d"; [ "$2" = eval ] && how=${EVAL_ON_HANG:-report}
  local hold=1; [ "$2" = eval ] && hold=0
  # Each GPU's utilization every 500 ms through the run (what tells an evaluation's
  # GPU work from a rank spinning in Python).
  nvidia-smi --query-gpu=timestamp,index,utilization.gpu --format=csv,noheader -lms 500 > "$d/gpu-util.csv" 2>/dev/null &
  local smi=$!
  echo "== hang $2 on $1 ranks: $(CASE=$2 HOLD_RANK=$hold python3 scripts/device/timed_run.py 100 "$d/stdout" "$d/stderr" "$T" --standalone --nproc-per-node="$1" --hang-timeout "${HANG_TIMEOUT:-20}" --on-hang $how --log-dir "$d/run" scripts/device/gpu_profiler_hang_rank.py)" | tee -a "$S"
  kill $smi 2>/dev/null
  lines "$d/stderr" | tee -a "$S"; keep "$d"
}
hang_two_nodes() {  # CASE: rank 3 of 2 nodes x 2 ranks holds
  local d=$OUT/hang2x2-$1 p=$((29600 + RANDOM % 300)) n; mkdir -p "$d"
  local args=(--nnodes=2 --master-addr=127.0.0.1 --master-port=$p --nproc-per-node=gpu --hang-timeout 20 --on-hang stop)
  CASE=$1 HOLD_RANK=3 CUDA_VISIBLE_DEVICES=0,1 python3 scripts/device/timed_run.py 100 "$d/stdout0" "$d/stderr0" "$T" --node-rank=0 "${args[@]}" --log-dir "$d/run0" scripts/device/gpu_profiler_hang_rank.py > "$d/exit0" &
  n=$!
  local one; one=$(CASE=$1 HOLD_RANK=3 CUDA_VISIBLE_DEVICES=2,3 python3 scripts/device/timed_run.py 100 "$d/stdout1" "$d/stderr1" "$T" --node-rank=1 "${args[@]}" --log-dir "$d/run1" scripts/device/gpu_profiler_hang_rank.py)
  wait $n  # here, not in a $(...): a subshell cannot wait for this shell's child
  echo "== hang $1 on 2 nodes x 2 ranks: node 1 $one; node 0 $(cat "$d/exit0")" | tee -a "$S"
  for n in 0 1; do cp "$d"/run$n/*/attempt_0/hang*.json "$d/hang-node$n.json" 2>/dev/null; done
  for n in 0 1; do
    echo "  node $n:" | tee -a "$S"; lines "$d/stderr$n" | tee -a "$S"
    cp -r "$d"/run$n/*/attempt_0/nccl-counters "$d/nccl-counters$n" 2>/dev/null
    counters "$d/nccl-counters$n" | tee -a "$S"; rm -rf "$d/run$n"
  done
}
straggler() {  # NPROC NAME VAR=VALUE...
  local n=$1 name=$2; shift 2; local d=$OUT/straggler$n-$name; mkdir -p "$d/at30" "$d/at50"
  # The counters live on /dev/shm while the attempt runs (toporun-<run dir's name>).
  local shm='/dev/shm/toporun-$(basename "$d"/run/*)/attempt_0'
  ( sleep 30; eval cp "$shm"/rank_* "$d/at30/"; sleep 20; eval cp "$shm"/rank_* "$d/at50/" ) &
  echo "== straggler $name on $n ranks: $(env SECS=60 "$@" python3 scripts/device/timed_run.py 120 "$d/stdout" "$d/stderr" "$T" --standalone --nproc-per-node="$n" --straggler-window=30 --log-dir "$d/run" scripts/device/gpu_nccl_straggler_rank.py) $(cat "$d/stdout")" | tee -a "$S"
  wait; lines "$d/stderr" | tee -a "$S"; keep "$d"
}
cost() {  # plugin off against its default sampling and against every operation timed
  VARIANTS=${VARIANTS:-none all bursts} bash scripts/device/gpu_profiler_cost.sh "$T" "$OUT/cost"
  cat "$OUT/cost/cost-summary.txt" >> "$S"
}
inproc() {
  local d=$OUT/inproc${INPROC_TAG:+-$INPROC_TAG}; mkdir -p "$d"
  [ -x "${BENCH_TOPORUN:-}" ] || { echo "== inproc: BENCH_TOPORUN is not an executable toporun" | tee -a "$S"; return; }
  echo "== inproc${INPROC_TAG:+ $INPROC_TAG}: $(python3 scripts/device/timed_run.py 500 "$d/stdout" "$d/stderr" "$BENCH_TOPORUN" --standalone --nproc-per-node="${NPROC:-4}" --nccl-profiler=on --gpu-timing=off --nccl-report=off --log-dir "$d/run" scripts/device/gpu_profiler_cost_inproc_rank.py)" | tee -a "$S"
  grep -E "^(sweep|train|timed|burst|threads)" "$d/stdout" | tee -a "$S"; lines "$d/stderr" | tee -a "$S"; rm -rf "$d/run"
}
nvidia-smi -L > "$OUT/gpus.txt" 2>&1; cp "$OUT/gpus.txt" "$RESULTS/"
for stage in ${STAGES:-hang2 hang4 straggler2 straggler4 cost}; do
  case $stage in
    hang2|hang4) for c in ${CASES:-spin stuck eval}; do hang "${stage#hang}" $c; pack; done ;;
    hang2x2) for c in spin stuck; do hang_two_nodes $c; pack; done ;;
    straggler2|straggler4) straggler "${stage#straggler}" slow SLOW_RANK=1 FACTOR=3; pack; straggler "${stage#straggler}" balanced ;;
    *) $stage ;;
  esac
  pack
done
