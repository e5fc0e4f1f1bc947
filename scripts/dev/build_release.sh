#!/usr/bin/env bash
# Portable release binaries: Linux x86-64 linked against glibc 2.17 (the manylinux2014
# baseline: Ubuntu 18.04+, RHEL/UBI 7+, every NGC image), built with cargo-zigbuild
# and Zig from PyPI into a cached virtualenv. NVML stays loaded at run time (dlopen).
# Writes OUT/toporun-<arch>-linux-gnu, the NCCL profiler plugin beside it
# (OUT/libtoporun_nccl_profiler-<arch>-linux-gnu.so, which toporun finds there) and
# OUT/SHA256SUMS; fails if any symbol needs a glibc newer than 2.17.
# Usage: scripts/dev/build_release.sh [OUT]   (default: dist)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-dist}
GLIBC=2.17
TOOLS=${TOPORUN_BUILD_VENV:-$HOME/.cache/toporun-build}
if ! "$TOOLS/bin/cargo-zigbuild" --version >/dev/null 2>&1; then
  echo "build-release: installing cargo-zigbuild and ziglang into $TOOLS (once)" >&2
  python3 -m venv "$TOOLS"
  "$TOOLS/bin/pip" install -q --disable-pip-version-check cargo-zigbuild ziglang
fi
export PATH="$TOOLS/bin:$PATH"
mkdir -p "$OUT"

# The newest GLIBC_x.y a binary needs.
needs() { objdump -T "$1" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1; }

build() { # rust target triple, arch name
  local triple=$1 arch=$2
  # The binary cargo just built, wherever its target directory is (CARGO_TARGET_DIR,
  # build.target-dir): never an older one left in ./target.
  local bin
  bin=$(cargo zigbuild --release -p toporun --target "$triple.$GLIBC" --message-format=json-render-diagnostics \
    | grep -o '"executable":"[^"]*/toporun"' | tail -1 | sed 's/^"executable":"//; s/"$//')
  if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    echo "build-release: cargo reported no toporun executable for $triple" >&2
    exit 1
  fi
  local need
  need=$(needs "$bin")
  if [ "$(printf '%s\n%s\n' "$need" "$GLIBC" | sort -V | tail -1)" != "$GLIBC" ]; then
    echo "build-release: $bin needs GLIBC_$need, newer than $GLIBC" >&2
    objdump -T "$bin" | grep "GLIBC_$need" >&2
    exit 1
  fi
  cp "$bin" "$OUT/toporun-$arch-linux-gnu"
  echo "build-release: $OUT/toporun-$arch-linux-gnu (needs GLIBC_$need at most)" >&2
  local lib
  lib=$(cargo zigbuild --release -p toporun-nccl-profiler --target "$triple.$GLIBC" --message-format=json-render-diagnostics \
    | grep -o '"[^"]*/libtoporun_nccl_profiler.so"' | tail -1 | tr -d '"')
  if [ -z "$lib" ] || [ ! -f "$lib" ]; then
    echo "build-release: cargo reported no NCCL profiler plugin for $triple" >&2
    exit 1
  fi
  need=$(needs "$lib")
  if [ "$(printf '%s\n%s\n' "$need" "$GLIBC" | sort -V | tail -1)" != "$GLIBC" ]; then
    echo "build-release: $lib needs GLIBC_$need, newer than $GLIBC" >&2
    exit 1
  fi
  cp "$lib" "$OUT/libtoporun_nccl_profiler-$arch-linux-gnu.so"
}

build x86_64-unknown-linux-gnu x86_64
# Grace Hopper / Grace Blackwell nodes: needs the Rust standard library for aarch64,
# which rustup fetches from static.rust-lang.org.
if ! rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; then
  rustup target add aarch64-unknown-linux-gnu >&2 || true
fi
if rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; then
  build aarch64-unknown-linux-gnu aarch64
else
  echo "build-release: aarch64 skipped: rustup could not install the aarch64-unknown-linux-gnu standard library (static.rust-lang.org unreachable?)" >&2
fi
(cd "$OUT" && sha256sum toporun-*-linux-gnu libtoporun_nccl_profiler-*-linux-gnu.so > SHA256SUMS)
cat "$OUT/SHA256SUMS"
