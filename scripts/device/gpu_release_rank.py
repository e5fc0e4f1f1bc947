"""A rank for scripts/gpu_release.sh. First attempt: starts a child in a session of
its own (out of the rank's process group) that holds 1 GiB of GPU memory for HOLD
seconds, says its pid and what NVML sees, and fails. Later attempts succeed."""
import os
import subprocess
import sys
import time

if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
    print("second attempt: started", flush=True)
    sys.exit(0)
hold = os.environ.get("HOLD", "10")
child = subprocess.Popen(
    [sys.executable, "-c", f"import torch, time; x = torch.empty(1 << 28, device='cuda'); print('held', flush=True); time.sleep({hold})"],
    start_new_session=True,
    stdout=subprocess.PIPE,
    text=True,
)
child.stdout.readline()
import pynvml

pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(int(os.environ["LOCAL_RANK"]))
pids = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
print(f"child pid {child.pid}; NVML lists {pids}", flush=True)
sys.exit(1)
