"""A rank that writes a captured NCCL log the way NCCL does: to NCCL_DEBUG_FILE with
%h (hostname) and %p (pid) substituted, truncating on open, its lines re-headed with
this process's host and pid. FAKE_NCCL_LOGS: comma-separated fixture logs, one per
global rank. FAKE_NCCL_EXIT: exit code after writing. Prints the NCCL_DEBUG* it got."""
import os
import re
import socket
import sys
import time

rank = int(os.environ["RANK"])
print("NCCL_ENV", " ".join(f"{k}={os.environ.get(k, '-')}" for k in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")), flush=True)
pattern = os.environ.get("NCCL_DEBUG_FILE")
logs = os.environ.get("FAKE_NCCL_LOGS", "").split(",")
if pattern and rank < len(logs) and logs[rank]:
    host, pid = socket.gethostname(), os.getpid()
    path = pattern.replace("%h", host).replace("%p", str(pid))
    head = re.compile(r"^(\[[^\]]*\]:)?[^\s:]+:\d+:\d+ ")
    with open(logs[rank]) as src, open(path, "w") as out:
        for i, line in enumerate(src):
            if " NCCL " not in line:
                continue
            out.write(head.sub(f"{host}:{pid}:{pid} ", line))
            if i % 50 == 0:
                out.flush()
                time.sleep(0.01)
time.sleep(float(os.environ.get("FAKE_NCCL_STAY", "0.5")))
sys.exit(int(os.environ.get("FAKE_NCCL_EXIT", "0")))
