"""A rank for scripts/device/gpu_fr_dumps.sh: three NCCL all_reduces on its GPU, then it
waits in a function of its own (a hang toporun should find and stop)."""
import os
import time

import torch
import torch.distributed as dist


def wait_for_data():
    time.sleep(3600)


local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
backend = dist.group.WORLD._get_backend(torch.device("cuda"))
print(f"torch {torch.__version__}: {type(backend).__name__}", flush=True)
if os.environ.get("FR_DIAG") == "1":
    import threading

    def watch_key():
        # A client of its own on the workers' store: does exception_dump arrive?
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
        while not store.check(["exception_dump"]):
            time.sleep(0.5)
        print(f"diag: exception_dump = {store.get('exception_dump')!r}", flush=True)

    threading.Thread(target=watch_key, daemon=True).start()
    keys = ["TORCH_FR_DUMP_TEMP_FILE", "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT"]
    print("diag:", {k: os.environ.get(k) for k in keys}, flush=True)
t = torch.ones(1 << 20, device="cuda")
for _ in range(3):
    dist.all_reduce(t)
torch.cuda.synchronize()
wait_for_data()
