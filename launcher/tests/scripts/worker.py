"""A worker for fault tests: MODE says what rank 0 does; the others run until told."""
import os, signal, sys, time
rank = int(os.environ["RANK"])
out = os.environ.get("PROBE_OUT", "/tmp")
mode = os.environ.get("MODE", "")
open(f"{out}/pid{rank}", "w").write(str(os.getpid()))
def on_term(sig, frame):
    open(f"{out}/term{rank}", "w").write(str(time.time()))
    sys.exit(143)
if mode == "ignore-term" and rank == 1:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, on_term)
if mode == "exit3" and rank == 0:
    time.sleep(0.5)
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
