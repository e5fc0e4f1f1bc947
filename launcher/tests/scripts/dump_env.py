"""Writes what the launcher gave this worker (environment and argv) to $PROBE_OUT."""
import json, os, sys
out = os.environ["PROBE_OUT"]
rank = os.environ.get("RANK", "x")
attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
with open(f"{out}/rank{rank}_attempt{attempt}.json", "w") as f:
    json.dump({"argv": sys.argv, "env": dict(os.environ)}, f)
if os.environ.get("FAIL_RANK") == rank and attempt == "0":
    sys.exit(5)
