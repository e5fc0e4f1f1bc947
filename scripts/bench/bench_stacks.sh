#!/usr/bin/env bash
# What reading the ranks' stacks costs: 8 Python processes standing in a call, the
# first capture (attaching) and a later one, and the CPU of sampling them at the hang
# watcher's intervals (1 s by default, 0.5 s with --hang-timeout 10), alone and with
# the straggler tracker fed at each sample (alternating, in the same run). Release build.
# Usage: scripts/bench/bench_stacks.sh [RUNS]   (default 3)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=$(scripts/dev/setup_venv.sh)
cargo build --release -q -p toporun
for _ in $(seq "${1:-3}"); do
  for ms in 1000 500 250; do
    target/release/toporun bench stacks --python "$PY" --ranks 8 --seconds 10 --interval-ms "$ms"
  done
done
