"""All_reduce bus bandwidth from 8 KiB to 1 GiB (a factor 4 apart), CUDA-event timed, for
scripts/device/gpu_profiler.sh's cost table: ITERS all_reduces a size after WARMUP.
Rank 0 prints `sweep BYTES US_PER_OP BUSBW_GBPS` per size."""
import os

import torch
import torch.distributed as dist

local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
n = dist.get_world_size()
for size in [8 << 10 << (2 * i) for i in range(9)] + [1 << 30]:
    t = torch.ones(size // 4, device="cuda")
    iters = max(20, min(2000, (256 << 20) // size))
    for _ in range(10):
        dist.all_reduce(t)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    # Every rank starts the timed loop together: a rank still finishing the last size
    # would show as a slow all_reduce on rank 0.
    dist.barrier()
    torch.cuda.synchronize()
    s.record()
    for _ in range(iters):
        dist.all_reduce(t)
    e.record()
    torch.cuda.synchronize()
    us = s.elapsed_time(e) * 1000 / iters
    if dist.get_rank() == 0:
        print(f"sweep {size} {us:.2f} {size * 2 * (n - 1) / n / us / 1000:.2f}", flush=True)
dist.destroy_process_group()
