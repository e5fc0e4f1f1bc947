"""A worker for fault tests: MODE says what rank 0 does; the others run until told.
Each rank installs its SIGTERM behaviour before writing its pid file, so a test that
waits for the pid files knows the handlers are in place."""
import os, signal, sys, time
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
out = os.environ.get("PROBE_OUT", "/tmp")
mode = os.environ.get("MODE", "")
def on_term(sig, frame):
    open(f"{out}/term{rank}", "w").write(str(time.time()))
    sys.exit(143)
if mode == "ignore-term" and rank == 1:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, on_term)
open(f"{out}/pid{rank}.tmp", "w").write(str(os.getpid()))
os.rename(f"{out}/pid{rank}.tmp", f"{out}/pid{rank}")
def all_ready():
    while not all(os.path.exists(f"{out}/pid{r}") for r in range(world)):
        time.sleep(0.01)
if mode == "exit3" and rank == 0:
    all_ready()
    time.sleep(0.2)
    open(f"{out}/exit{rank}", "w").write(str(time.time()))
    sys.exit(3)
if mode == "raise" and rank == 0:
    from torch.distributed.elastic.multiprocessing.errors import record
    @record
    def main():
        time.sleep(0.3)
        raise ValueError("boom from rank 0")
    main()
if mode == "grandchild" and rank == 0:
    import subprocess
    p = subprocess.Popen(["sleep", "300"], start_new_session=False)
    open(f"{out}/grandchild", "w").write(str(p.pid))
time.sleep(60)
