#!/usr/bin/env bash
# The same preempted job under toporun and torchrun: 2 c10d nodes on loopback, 2 gloo
# ranks each with a DataLoader of 2 workers, every rank's SIGTERM handler sets a flag
# the loop all-reduces (launcher/tests/scripts/preempt.py); SIGTERM to the second
# node's launcher only. Prints, per launcher, the ranks that saved, the exit codes and
# the time from the signal to the last exit.
# Usage: scripts/bench/preempt_vs_torchrun.sh [TOPORUN] [TORCHRUN]   (after scripts/dev/setup_venv.sh)
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=$(scripts/dev/setup_venv.sh)
TOPORUN=${1:-target/release/toporun}
TORCHRUN=${2:-$(dirname "$PY")/torchrun}
run() {
  local name=$1 launcher=$2 extra=$3 port dir
  port=$(python3 -c "import socket; s=socket.socket(); s.bind(('',0)); print(s.getsockname()[1])")
  dir=$(mktemp -d)
  local pids=()
  for n in 0 1; do
    MODE=handler OUT=$dir CKPT=$dir/ckpt PYTHON_EXEC=$PY TOPORUN_STOP_FILE=$dir/stop$n \
      timeout 120 "$launcher" --nnodes=2 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:$port \
      --nproc-per-node=2 $extra launcher/tests/scripts/preempt.py > "$dir/out$n" 2> "$dir/err$n" &
    pids+=($!)
  done
  until [ "$(ls "$dir"/ready* 2>/dev/null | wc -l)" -ge 4 ]; do sleep 0.2; done
  local start codes=""
  start=$(date +%s.%N)
  # timeout(1) passes SIGTERM on to the launcher it runs.
  kill -TERM "${pids[1]}"
  for p in "${pids[@]}"; do wait "$p"; codes="$codes $?"; done
  echo "$name: $(cat "$dir"/out* | grep -c 'saved at step') of 4 ranks saved; exit codes:$codes;" \
    "last exit $(python3 -c "import time; print(round(time.time() - $start, 1))") s after the signal"
  grep -hoE "DataLoader worker \(pid[^)]*\) is killed by signal: [A-Za-z]+|Connection closed by peer" "$dir"/err* | sort | uniq -c
  rm -rf "$dir"
}
run toporun "$TOPORUN" "--nccl-report=off --exit-codes=classified"
run torchrun "$TORCHRUN" ""
