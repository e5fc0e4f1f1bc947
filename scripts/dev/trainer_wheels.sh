#!/usr/bin/env bash
# The wheels the GPU machines need (they have torch 2.11 on Python 3.12 and no package
# index): Transformers, accelerate, Lightning and what they pull beyond what torch
# already gives, for issue 61's real trainers, and pyroute2, for the scripts that make
# network namespaces (gpu_network_check.sh, gpu_nccl_evidence.sh, gpu_full_node.sh: pass
# .whl as their wheel directory), into .whl/ (about 35 MB; carry it with the run).
# Usage: scripts/dev/trainer_wheels.sh [PYTHON]  (any Python with pip; resolves for 3.12)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${1:-python3} PKGS="transformers accelerate pytorch-lightning pyroute2"
plat=(--python-version 3.12 --only-binary=:all: --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
report=$(mktemp) urls=$(mktemp)
"$PY" -m pip install --quiet --dry-run --ignore-installed --target "$(mktemp -d)" --report "$report" "${plat[@]}" $PKGS
# torch and what it brings are on the GPU machine already
"$PY" - "$report" > "$urls" <<'PY'
import json, sys
have = {"torch", "triton", "numpy", "sympy", "mpmath", "networkx", "jinja2", "markupsafe", "fsspec", "filelock", "typing_extensions", "setuptools"}
for item in json.load(open(sys.argv[1]))["install"]:
    name = item["metadata"]["name"].lower().replace("-", "_")
    if name not in have and not name.startswith("nvidia"):
        print(item["download_info"]["url"])
PY
mkdir -p .whl
(cd .whl && xargs -n1 curl -sSfLO < "$urls")
rm -f "$urls" "$report"
echo "$(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1), in .whl/"
