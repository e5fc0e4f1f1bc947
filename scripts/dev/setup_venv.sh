#!/usr/bin/env bash
# Creates (once) the cached virtualenv with real PyTorch that the end-to-end tests use
# as the reference torchrun, TCPStore and gloo workers. Prints the python path.
set -euo pipefail
VENV=${TOPORUN_VENV:-$HOME/.cache/toporun-venv}
if ! "$VENV/bin/python" -c "import torch, numpy" >/dev/null 2>&1; then
  echo "setup-venv: installing torch into $VENV (about 5 GB, once)" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --no-cache-dir --disable-pip-version-check torch numpy >&2
fi
# The status endpoint's tests parse /metrics with Prometheus' own Python parser; the
# manifests' tests validate them with Kubernetes' own schemas and the Kubeflow Trainer's
# API models; the lost-peer test makes its network namespace with pyroute2; the
# terminal test draws a tqdm bar. No pip cache: the wheels would take the disk a second time.
if ! "$VENV/bin/python" -c "import prometheus_client, kubernetes_validate, kubeflow_trainer_api, pyroute2, tqdm" >/dev/null 2>&1; then
  "$VENV/bin/pip" install -q --no-cache-dir --disable-pip-version-check prometheus_client kubernetes-validate kubeflow-trainer-api pyroute2 tqdm >&2
fi
echo "$VENV/bin/python"
