"""Runs a command with each line of its stderr stamped with the seconds since start
(`[12.34] toporun: hang: ...`), its stdout to a file; kills its process group and
every descendant at DEADLINE s (torchrun starts its ranks in sessions of their own:
left alive, they held the GPUs of the next runs). Prints `exit CODE after S s` (code 124: killed at the deadline).
Usage: python3 scripts/device/timed_run.py DEADLINE STDOUT STDERR CMD..."""
import os
import signal
import subprocess
import sys
import threading
import time

def descendants(pid):
    """Every process below `pid`, from /proc's children lists."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                kids = []
            found += kids
            todo += kids
    return found


deadline, out, err, cmd = float(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
start = time.monotonic()
with open(out, "wb") as o, open(err, "w") as e:
    p = subprocess.Popen(cmd, stdout=o, stderr=subprocess.PIPE, start_new_session=True)

    def stamp():
        for raw in p.stderr:
            e.write(f"[{time.monotonic() - start:7.2f}] {raw.decode(errors='replace')}")
            e.flush()

    t = threading.Thread(target=stamp, daemon=True)
    t.start()
    try:
        code = p.wait(timeout=deadline)
    except subprocess.TimeoutExpired:
        tree = descendants(p.pid)
        os.killpg(p.pid, signal.SIGTERM)
        time.sleep(3)
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
        code = 124
    t.join(5)
print(f"exit {code} after {time.monotonic() - start:.1f} s")
