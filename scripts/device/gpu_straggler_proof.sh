#!/usr/bin/env bash
# Issue 39 on a 2-GPU machine: the GPU straggler named from each rank's GPU time in
# collectives (--gpu-timing on, the default), nobody named in a balanced job, and
# the step-time cost of the timing and the dumps against --gpu-timing off
# (alternating runs, a sub-ms step and a ~60 ms step); then small all_reduces from a
# CUDA graph, NCCL's defaults against toporun's plan (issue 37). Each stage runs while
# the call has time (LIMIT, 560 s) and writes into OUT as it goes.
# JOBS (slow balanced ckpt links; empty: none; ckpt: balanced, every rank pausing 3 s
# in save_checkpoint every 10 s; links: balanced with 25 MiB buckets and
# NCCL_P2P_DISABLE=1, the NVLink pair unused; control: the same on NVLink), GPU_TIMING (--gpu-timing for the jobs;
# unset: toporun's default), COST (alternate: mean step time on/off; stalls: each
# step's time, alternating STALLS variants ("tag|flags|VAR=v,VAR=v", default off and
# on) of STALL_SECS s (35) at STEP_VARS (the ~60 ms step), the mean from STALL_FROM s
# (12) and each stall, so a dump's own cost shows; none), COST_ENV (variables for the cost runs only).
# Usage (device): mkdir -p OUT && scripts/device/gpu_straggler_proof.sh TOPORUN OUT
set -uo pipefail
T=$(readlink -f "$1") OUT=$(readlink -f "$2")
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R=scripts/device/gpu_nccl_straggler_rank.py LIMIT=${LIMIT:-560}
left() { echo $((LIMIT - SECONDS)); }
S=$OUT/summary.txt
named() {  # NAME SECS VAR=VALUE...: an NPROC-rank job (2 by default) under toporun's defaults, its straggler lines
  local name=$1 secs=$2; shift 2
  env "$@" SECS="$secs" python3 scripts/device/timed_run.py $((secs + 40)) "$OUT/$name.out" "$OUT/$name.err" \
    "$T" --standalone --nproc-per-node="${NPROC:-2}" --straggler-window=30 --status-port=29555 \
    ${GPU_TIMING:+--gpu-timing=$GPU_TIMING} $R > "$OUT/$name.exit" &
  local pid=$!
  sleep $((secs - 5)); curl -s localhost:29555/metrics | grep -E "^toporun_(rank_gpu_wait_share|collective_busbw|rank_wait_share|straggler)" > "$OUT/$name.metrics"
  wait $pid; echo "$name: $(cat "$OUT/$name.exit") $(grep step_ms "$OUT/$name.out")" | tee -a "$S"
  grep -E "toporun: (straggler|warning|slow links|links)" "$OUT/$name.err" | cut -c1-500 | tee -a "$S"
  cat "$OUT/$name.metrics" >> "$S"
}
for j in ${JOBS-slow balanced}; do
  [ "$(left)" -gt 120 ] || break
  case $j in
    slow) named slow 70 SLOW_RANK=1 FACTOR=3 ;;
    balanced) named balanced 100 ;;
    ckpt) named ckpt 70 CKPT_EVERY=10 CKPT_S=3 ;;
    links) named links 45 NCCL_P2P_DISABLE=1 BUCKET_MIB=25 ;;
    control) named control 45 BUCKET_MIB=25 ;;
  esac
done
dumps_seen() {  # LOGDIR: every second while the job runs, when rank 0's last sampled dump landed
  while sleep 1; do find "$1" -path '*fr-sampled/rank_0' -printf '%T@\n' 2>/dev/null; done
}
stalls() {  # each step timed, alternating STALLS variants (tag|flags|env), STALL_SECS s each
  echo "== stalls: each step timed (steps-*.txt), mean from ${STALL_FROM:-12} s" | tee -a "$S"
  local args=() v tag flags vars n
  for round in 1 2; do
    for v in ${STALLS:-"off|--gpu-timing=off|" "on|--gpu-timing=on|"}; do
      IFS='|' read -r tag flags vars <<< "$v"
      tag=$tag-$round
      [ "$(left)" -gt $((${STALL_SECS:-35} + 40)) ] || break 2
      dumps_seen "$OUT/logs-$tag" > "$OUT/dumps-$tag.txt" & n=$!
      env ${STEP_VARS:-SIZE=8192 WORK=40 BUCKET_MIB=25} ${vars//,/ } SECS=${STALL_SECS:-35} \
        STEP_LOG=$OUT/steps-$tag.txt timeout 90 "$T" --standalone --nproc-per-node="${NPROC:-2}" \
        --log-dir "$OUT/logs-$tag" ${flags//,/ } $R > /dev/null 2> "$OUT/stall-$tag.err"
      kill $n; args+=("$OUT/steps-$tag.txt:$(sort -u "$OUT/dumps-$tag.txt" | grep -c .)")
    done
  done
  python3 scripts/bench/step_stalls.py --from "${STALL_FROM:-12}" "${args[@]}" | tee -a "$S"
  grep -h "toporun: .*links" "$OUT"/stall-*.err | cut -c1-300 | tee -a "$S"
}
[ "${COST:-alternate}" = stalls ] && stalls
[ "${COST:-alternate}" = alternate ] && echo "== cost: --gpu-timing on against off, step ms of rank 0, alternating" | tee -a "$S"
[ "${COST:-alternate}" = alternate ] && for step in "small SIZE=4096 WORK=2" "large SIZE=8192 WORK=40 BUCKET_MIB=25"; do
  read -r tag vars <<< "$step"
  for run in 1 2 3; do
    for timing in on off; do
      [ "$(left)" -gt 110 ] || break 3
      ms=$(env $vars ${COST_ENV:-} SECS=18 timeout 60 "$T" --standalone --nproc-per-node="${NPROC:-2}" --gpu-timing=$timing $R 2>/dev/null | grep -o 'step_ms [0-9.]*')
      echo "$tag gpu-timing=$timing run $run: $ms" | tee -a "$S"
    done
  done
done
if [ "${GRAPH_STAGE:-1}" = 1 ] && [ "$(left)" -gt 60 ]; then
  echo "== small all_reduces from a CUDA graph" | tee -a "$S"
  GRAPH=1 RUNS=3 MIB=1,2,4,8 TRIAL_S=0.2 timeout $(($(left) - 5)) bash scripts/device/gpu_busbw_small.sh "$T" "$OUT" > "$OUT/graph.log" 2>&1
  tail -6 "$OUT/busbw-small-table.txt" >> "$S"
fi
echo "== done at $SECONDS s" | tee -a "$S"
