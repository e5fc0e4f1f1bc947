#!/usr/bin/env bash
# How often a training script's ranks abort at exit ("terminate called without an
# active exception", PyTorch's gloo teardown), under toporun and torchrun in the same
# run, on a CPU made busy by two spinning processes (where the abort shows).
#   scripts/bench/teardown_aborts.sh SCRIPT [RUNS]   (default 16; 2 gloo ranks, --standalone)
# Needs target/debug/toporun (cargo build) and PYTHON_EXEC or the test virtualenv.
set -euo pipefail
cd "$(dirname "$0")/../.."
script=$1
runs=${2:-16}
export PYTHON_EXEC=${PYTHON_EXEC:-$(scripts/dev/setup_venv.sh)}
torchrun="$(dirname "$PYTHON_EXEC")/torchrun"
yes >/dev/null &
b1=$!
yes >/dev/null &
b2=$!
trap 'kill $b1 $b2 2>/dev/null' EXIT
for launcher in target/debug/toporun "$torchrun"; do
  aborted=0
  failed=0
  for _ in $(seq "$runs"); do
    if ! timeout 120 "$launcher" --standalone --nproc-per-node=2 "$script" >/dev/null 2>/tmp/teardown.err; then
      failed=$((failed + 1))
    fi
    if grep -q "terminate called" /tmp/teardown.err; then aborted=$((aborted + 1)); fi
  done
  echo "$(basename "$launcher"): $aborted of $runs runs aborted at exit ($failed failed)"
done
