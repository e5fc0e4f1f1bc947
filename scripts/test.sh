#!/usr/bin/env bash
# The whole test suite: real PyTorch (cached virtualenv) and a real etcd (Debian's
# etcd-server) for the end-to-end tests, then every crate's unit and end-to-end tests,
# the ones `cargo test` alone leaves out (#[ignore = "needs PyTorch..."]) included.
set -euo pipefail
cd "$(dirname "$0")/.."
export TOPORUN_PYTHON=$(scripts/setup-venv.sh)
export TOPORUN_ETCD=$(scripts/setup-etcd.sh)
# Tests that cannot run here (no root for a namespace or a cgroup, no address) say
# so; the list is printed at the end, passed or not.
skipped=target/tmp/skipped-tests.txt
rm -f "$skipped"
trap '[ -s "$skipped" ] && { echo "tests skipped on this machine (they passed without testing):"; sort -u "$skipped"; }' EXIT
cargo test --workspace --all-targets "$@" -- --include-ignored
