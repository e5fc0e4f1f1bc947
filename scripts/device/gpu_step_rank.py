"""A rank for scripts/device/gpu_xid_watch.sh: STEPS steps of a matmul and an NCCL
all_reduce on its GPU; rank 0 prints the mean step time (ms) of the last 80%."""
import os
import time

import torch
import torch.distributed as dist

local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
g = torch.randn(32 << 20, device="cuda")
steps = int(os.environ.get("STEPS", "300"))
times = []
for _ in range(steps):
    torch.cuda.synchronize()
    t = time.perf_counter()
    (a @ a).sum()
    dist.all_reduce(g)
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
kept = times[steps // 5 :]
if dist.get_rank() == 0:
    print(f"step_ms {1000 * sum(kept) / len(kept):.3f}", flush=True)
dist.destroy_process_group()
