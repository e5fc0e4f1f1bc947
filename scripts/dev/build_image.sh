#!/usr/bin/env bash
# Builds the FROM-scratch image holding the portable binary and its NCCL profiler plugin
# (scripts/dev/build_release.sh)
# with buildah (Debian's package; vfs storage needs no privileges), then exports it to
# an OCI archive. Usage: scripts/dev/build_image.sh [TAG] [OUT]   (default toporun:dev, dist)
set -euo pipefail
cd "$(dirname "$0")/../.."
TAG=${1:-toporun:dev}
OUT=${2:-dist}
if ! command -v buildah >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "build-image: installing buildah (Debian package)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q buildah >&2
  else
    echo "build-image: buildah is missing: install it (apt-get install buildah, dnf install buildah) and run this again" >&2
    exit 1
  fi
fi
[ -x "$OUT/toporun-x86_64-linux-gnu" ] || scripts/dev/build_release.sh "$OUT"
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/toporun/bin" "$STAGE/toporun/lib"
cp "$OUT/toporun-x86_64-linux-gnu" "$STAGE/toporun/bin/toporun"
# toporun finds its NCCL profiler plugin in ../lib.
cp "$OUT/libtoporun_nccl_profiler-x86_64-linux-gnu.so" "$STAGE/toporun/lib/libtoporun_nccl_profiler.so"
ln -s toporun "$STAGE/toporun/bin/torchrun"
B="buildah --storage-driver vfs"
$B bud --isolation chroot -f container/Containerfile.scratch -t "$TAG" "$STAGE" >&2
rm -f "$OUT/toporun-image.tar"
$B push "$TAG" "oci-archive:$OUT/toporun-image.tar" >&2
echo "$OUT/toporun-image.tar"
