"""Validates Kubernetes manifests with kubernetes-validate (Kubernetes' own schemas,
strict: unknown fields are errors) against every version from 1.31 (the oldest that
managed clusters still run) to the newest it knows, Kubeflow TrainJobs with kubeflow-trainer-api (the
models generated from the Trainer's OpenAPI: types checked, unknown fields reported),
and prints every toporun/torchrun command line in them as JSON, one per line, for the
caller to run through toporun's own parser. Kinds without a schema here are reported
on stderr.
Usage: python check_manifests.py FILE...   (exit 1 when a manifest is invalid)"""
import json
import sys

import kubernetes_validate as kv
import yaml
from kubernetes_validate import utils as kv_utils
from kubeflow_trainer_api import models as trainer

CRDS = {("trainer.kubeflow.org/v1alpha1", "TrainJob"): trainer.TrainerV1alpha1TrainJob}

failed = False

OLDEST = (1, 31)
VERSIONS = sorted(
    {v for v in kv_utils.all_versions() if tuple(int(x) for x in v.split(".")[:2]) >= OLDEST},
    key=lambda v: tuple(int(x) for x in v.split(".")),
)


def commands(node):
    """Every container's command+args whose program is toporun or torchrun."""
    if isinstance(node, dict):
        cmd = node.get("command")
        if isinstance(cmd, list) and cmd and str(cmd[0]).split("/")[-1] in ("toporun", "torchrun"):
            yield [str(x) for x in cmd + node.get("args", [])]
        for v in node.values():
            yield from commands(v)
    elif isinstance(node, list):
        for v in node:
            yield from commands(v)


def unknown(given, known, path=""):
    """Fields of the manifest that the model dropped: not in the schema."""
    if isinstance(given, dict) and isinstance(known, dict):
        for k, v in given.items():
            if k not in known:
                yield f"{path}.{k}".lstrip(".")
            else:
                yield from unknown(v, known[k], f"{path}.{k}")
    elif isinstance(given, list) and isinstance(known, list):
        for i, (g, k) in enumerate(zip(given, known)):
            yield from unknown(g, k, f"{path}[{i}]")


def crd(path, doc, model):
    global failed
    try:
        known = model.from_dict(doc).to_dict()
    except Exception as e:  # pydantic's ValidationError and type errors
        failed = True
        print(f"{path}: {doc.get('kind')}: {e}", file=sys.stderr)
        return
    for field in unknown(doc, known):
        failed = True
        print(f"{path}: {doc.get('kind')}: unknown field {field}", file=sys.stderr)


for path in sys.argv[1:]:
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    for doc in docs:
        model = CRDS.get((doc.get("apiVersion"), doc.get("kind")))
        try:
            if model is not None:
                crd(path, doc, model)
            else:
                for version in VERSIONS:
                    try:
                        kv.validate(doc, version, strict=True)
                    except kv.ValidationError as e:
                        failed = True
                        where = ".".join(str(p) for p in e.path)
                        print(f"{path}: {doc.get('kind')} (Kubernetes {version}): {e.message} at {where}", file=sys.stderr)
        except kv.SchemaNotFoundError:
            print(f"{path}: no schema for {doc.get('apiVersion')} {doc.get('kind')}", file=sys.stderr)
        for c in commands(doc):
            print(json.dumps({"file": path, "command": c}))
sys.exit(1 if failed else 0)
