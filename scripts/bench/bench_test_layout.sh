#!/usr/bin/env bash
# Build cost of the end-to-end tests: every file a module of one binary (the layout
# in the tree, launcher/tests/e2e/main.rs) against one test binary per file,
# measured in the same run on two clones of HEAD with their own target directories.
#   scripts/bench/bench_test_layout.sh [ROUNDS]   (default 2; prints seconds per build)
# Measures, with the dependencies already built: the launcher and its tests built
# from nothing (`cargo clean -p toporun`), and after touching the tests' shared
# support module (what every edit there costs). Dependencies are the same in both.
set -euo pipefail
rounds=${1:-2}
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/toporun-layout.XXXXXX)
trap 'rm -rf "$work"' EXIT

git clone -q "$repo" "$work/files"
git clone -q "$repo" "$work/one"
# The tree's layout is one binary; the other is remade: every module its own file.
(
  cd "$work/files/launcher/tests"
  for f in e2e/*.rs; do
    [ "$(basename "$f")" = main.rs ] && continue
    sed -e 's/^use crate::support;$/mod support;/' "$f" >"$(basename "$f")"
  done
  rm -r e2e
)

build() { (cd "$work/$1" && cargo build -q -p toporun --tests); }
timed() { local s; s=$(date +%s.%N); build "$1"; echo "$(date +%s.%N) - $s" | bc; }

for l in files one; do build "$l"; done # dependencies, once
for r in $(seq "$rounds"); do
  for l in files one; do
    (cd "$work/$l" && cargo clean -q -p toporun)
    echo "round $r $l from-clean $(timed "$l")"
  done
  for l in files one; do
    touch "$work/$l/launcher/tests/support/mod.rs"
    echo "round $r $l touch-support $(timed "$l")"
  done
done
for l in files one; do
  n=$(find "$work/$l/target/debug/deps" -maxdepth 1 -type f -executable -name '*_e2e-*' -o -maxdepth 1 -type f -executable -name 'e2e-*' | wc -l)
  size=$(du -sh "$work/$l/target/debug/deps" | cut -f1)
  echo "$l: $n test binaries; target/debug/deps $size"
done
