#!/usr/bin/env bash
# `toporun bench rendezvous` with N simulated nodes against toporun's store server (its own
# process, `bench store-server`, as against PyTorch's)
# and against PyTorch's own TCPStore server (from the test virtualenv), same run.
# Usage: scripts/bench/bench_rendezvous_vs_pytorch.sh [N] [TOPORUN]
set -euo pipefail
N=${1:-1024}
T=${2:-target/release/toporun}
PY=$(scripts/dev/setup_venv.sh)
PORT_FILE=$(mktemp)
"$PY" -c "
import sys, time, torch.distributed as dist
from datetime import timedelta
s = dist.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=3600))
open(sys.argv[1], 'w').write(str(s.port))
time.sleep(3600)" "$PORT_FILE" 2>/dev/null &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; rm -f "$PORT_FILE"' EXIT
for _ in $(seq 100); do [ -s "$PORT_FILE" ] && break; sleep 0.1; done
echo "toporun store:  $("$T" bench rendezvous --nodes "$N" --format json)"
echo "PyTorch store:  $("$T" bench rendezvous --nodes "$N" --endpoint "127.0.0.1:$(cat "$PORT_FILE")" --timeout 3000 --format json)"
