#!/usr/bin/env bash
# Tests the built image the way a user's Dockerfile uses it: unpacks its filesystem
# from the OCI archive and runs the binary found there (probe, a dry run, a 2-rank
# gloo job with real PyTorch through the `torchrun` link).
# Usage: scripts/dev/test_image.sh [dist/toporun-image.tar]
set -euo pipefail
cd "$(dirname "$0")/../.."
ARCHIVE=${1:-dist/toporun-image.tar}
ROOT=$(mktemp -d)
trap 'rm -rf "$ROOT"' EXIT
mkdir "$ROOT/oci" "$ROOT/fs"
tar -xf "$ARCHIVE" -C "$ROOT/oci"
# Every layer of the image's manifest, in order.
python3 - "$ROOT/oci" "$ROOT/fs" <<'PY'
import json, sys, tarfile, os
oci, fs = sys.argv[1], sys.argv[2]
blob = lambda d: os.path.join(oci, "blobs", *d.split(":"))
index = json.load(open(os.path.join(oci, "index.json")))
manifest = json.load(open(blob(index["manifests"][0]["digest"])))
for layer in manifest["layers"]:
    with tarfile.open(blob(layer["digest"])) as t:
        try:
            t.extractall(fs, filter="tar")
        except TypeError:  # Python without extraction filters
            t.extractall(fs)
PY
BIN=$ROOT/fs/toporun/bin
ls -l "$BIN"
[ "$(readlink "$BIN/torchrun")" = toporun ]
"$BIN/toporun" --version
"$BIN/toporun" probe > /dev/null
"$BIN/toporun" launch --dry-run --nproc-per-node=2 train.py > /dev/null
# The NCCL profiler plugin is found in the image's ../lib and loads as NCCL loads it.
"$BIN/toporun" launch --dry-run --facts tests/fixtures/hosts/h200x4.json --nproc-per-node=2 train.py \
  | grep -F "NCCL_PROFILER_PLUGIN=$ROOT/fs/toporun/lib/libtoporun_nccl_profiler.so"
python3 -c "import ctypes, sys; ctypes.CDLL(sys.argv[1]).ncclProfiler_v5" "$ROOT/fs/toporun/lib/libtoporun_nccl_profiler.so"
PY=$(scripts/dev/setup_venv.sh)
# A virtualenv whose bin/torchrun is the image's binary.
VENV=$ROOT/venv
mkdir -p "$VENV/bin"
ln -s "$(cd "$(dirname "$PY")/.." && pwd)/lib" "$VENV/lib"
cp "$(dirname "$PY")/../pyvenv.cfg" "$VENV/"
ln -s "$PY" "$VENV/bin/python3"
cp -P "$BIN/torchrun" "$BIN/toporun" "$VENV/bin/"
"$VENV/bin/torchrun" --standalone --nproc-per-node=2 --nccl-report=off \
  launcher/tests/scripts/allreduce_gloo.py
echo "test-image: probe, dry run, the NCCL profiler plugin and a 2-rank gloo job ran from the image"
