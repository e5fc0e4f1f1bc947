#!/usr/bin/env bash
# The whole test suite: real PyTorch (cached virtualenv) for the end-to-end tests,
# then every crate's unit and end-to-end tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export TOPORUN_PYTHON=$(scripts/setup-venv.sh)
cargo test --workspace --all-targets "$@"
