"""Writes what the launcher gave this worker (environment and argv) to $PROBE_OUT,
atomically (temp file + rename): a rank stopped mid-write leaves no partial file."""
import json, os, sys
out = os.environ["PROBE_OUT"]
rank = os.environ.get("RANK", "x")
attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
path = f"{out}/rank{rank}_attempt{attempt}.json"
with open(path + ".tmp", "w") as f:
    json.dump({"argv": sys.argv, "env": dict(os.environ)}, f)
os.rename(path + ".tmp", path)
if os.environ.get("FAIL_RANK") == rank and attempt == "0":
    sys.exit(5)
