#!/usr/bin/env bash
# The whole test suite: real PyTorch (cached virtualenv) and a real etcd (Debian's
# etcd-server) for the end-to-end tests, then every crate's unit and end-to-end tests,
# the ones `cargo test` alone leaves out (#[ignore = "needs PyTorch..."]) included.
# Every test binary runs, even after one fails; the end says, per binary, what passed,
# failed and did not run, and names each failed test.
set -euo pipefail
cd "$(dirname "$0")/../.."
export TOPORUN_PYTHON=$(scripts/dev/setup_venv.sh)
export TOPORUN_ETCD=$(scripts/dev/setup_etcd.sh)
mkdir -p target/tmp
# Tests that cannot run here (no root for a namespace or a cgroup, no address) say
# so; the list is printed at the end, passed or not.
skipped=target/tmp/skipped-tests.txt log=target/tmp/test-output.log
rm -f "$skipped"
summary() {
  echo "== test summary (full output: $log)"
  awk '/^     Running / { bin = $2; if ($2 == "unittests" && match($0, /deps\/[^ )]+-/)) bin = substr($0, RSTART + 5, RLENGTH - 6) " (unit tests)" }
       /^   Doc-tests / { bin = "doc-tests " $2 }
       /^test result: / { printf "  %-60s %s\n", bin, $0 }' "$log"
  grep -E "^test .* \.\.\. FAILED$" "$log" | sed 's/^test /  FAILED: /; s/ \.\.\. FAILED$//' || true
  # Why each failed: its panic and the message's first lines, cut short, so a CI
  # report that keeps only the end of the output still says it.
  awk '/^thread .* panicked at / { left = 5 } left > 0 { print "    " substr($0, 1, 300); left-- }' "$log" || true
  grep -E "^error: (could not compile|test failed)" "$log" | sed 's/^/  /' || true
  [ -s "$skipped" ] && { echo "tests skipped on this machine (they passed without testing):"; sort -u "$skipped"; }
  return 0
}
trap summary EXIT
cargo test --workspace --all-targets --no-fail-fast "$@" -- --include-ignored 2>&1 | tee "$log"
