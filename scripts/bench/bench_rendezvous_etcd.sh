#!/usr/bin/env bash
# Rendezvous of N simulated nodes against toporun's store (in its own process) and
# against a 3-member etcd cluster on loopback, same run; then 16,384 nodes against
# toporun's store, 3 times. Usage: scripts/bench/bench_rendezvous_etcd.sh [TOPORUN]
set -euo pipefail
cd "$(dirname "$0")/../.."
TOPORUN=${1:-target/release/toporun}
ETCD=$(scripts/dev/setup_etcd.sh)
DIR=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$DIR"' EXIT
CLUSTER=m0=http://127.0.0.1:23880,m1=http://127.0.0.1:23881,m2=http://127.0.0.1:23882
for i in 0 1 2; do
  "$ETCD" --name m$i --data-dir "$DIR/m$i" \
    --listen-client-urls http://127.0.0.1:2387$i --advertise-client-urls http://127.0.0.1:2387$i \
    --listen-peer-urls http://127.0.0.1:2388$i --initial-advertise-peer-urls http://127.0.0.1:2388$i \
    --initial-cluster $CLUSTER --initial-cluster-state new >"$DIR/m$i.log" 2>&1 &
done
EPS=127.0.0.1:23870,127.0.0.1:23871,127.0.0.1:23872
for _ in $(seq 100); do
  curl -sf -X POST http://127.0.0.1:23870/v3/kv/range -d '{"key":"eA=="}' >/dev/null && break
  sleep 0.1
done
echo "nodes  toporun store (s)  etcd 3 members (s)  etcd/store"
for n in ${NODES:-16 64 256 1024}; do
  s=$("$TOPORUN" bench rendezvous --nodes $n --format json | python3 -c 'import json,sys;print(json.load(sys.stdin)["seconds"])')
  e=$("$TOPORUN" bench rendezvous --nodes $n --backend etcd --endpoint $EPS --timeout 300 --format json | python3 -c 'import json,sys;print(json.load(sys.stdin)["seconds"])')
  python3 -c "print(f'$n'.ljust(7), f'{$s:.3f}'.ljust(18), f'{$e:.3f}'.ljust(19), f'{$e/$s:.0f}x')"
done
echo "16384 nodes, toporun's store, 3 runs:"
for _ in 1 2 3; do "$TOPORUN" bench rendezvous --nodes 16384; done
