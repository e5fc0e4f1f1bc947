"""Validates Kubernetes manifests with kubernetes-validate (Kubernetes' own schemas,
strict: unknown fields are errors) and prints every toporun/torchrun command line in
them as JSON, one per line, for the caller to run through toporun's own parser.
Kinds without a schema here (CRDs such as TrainJob) are reported on stderr.
Usage: python check_manifests.py FILE...   (exit 1 when a manifest is invalid)"""
import json
import sys

import kubernetes_validate as kv
import yaml

failed = False


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


for path in sys.argv[1:]:
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    for doc in docs:
        try:
            kv.validate(doc, kv.latest_version(), strict=True)
        except kv.SchemaNotFoundError:
            print(f"{path}: no schema for {doc.get('apiVersion')} {doc.get('kind')}", file=sys.stderr)
        except kv.ValidationError as e:
            failed = True
            print(f"{path}: {doc.get('kind')}: {e.message} at {'.'.join(str(p) for p in e.path)}", file=sys.stderr)
        for c in commands(doc):
            print(json.dumps({"file": path, "command": c}))
sys.exit(1 if failed else 0)
