"""A DDP job whose ranks run a real backward (scripts/device/gpu_first_cause_pass2.sh): a
4-layer MLP of WIDTH, a batch of BATCH rows, SGD; rank SLOW_RANK's batch is FACTOR
times the others' (uneven batches: its GPU works FACTOR times as long in forward and
backward, and DDP's all_reduces in backward wait for it). Runs SECS s, the ranks
agreeing when to stop; rank 0 prints its step count."""
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

env = os.environ.get
SLOW_RANK, FACTOR = int(env("SLOW_RANK", "-1")), int(env("FACTOR", "1"))
SECS, WIDTH, BATCH = float(env("SECS", "60")), int(env("WIDTH", "4096")), int(env("BATCH", "2048"))
local = int(env("LOCAL_RANK"))
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
rank = dist.get_rank()
layers = [torch.nn.Linear(WIDTH, WIDTH) for _ in range(4)]
model = DDP(torch.nn.Sequential(*layers).cuda(), device_ids=[local])
opt = torch.optim.SGD(model.parameters(), lr=1e-6)
x = torch.randn(BATCH * (FACTOR if rank == SLOW_RANK else 1), WIDTH, device="cuda")


def train_step():
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


stop, start, steps = torch.zeros(1, device="cuda"), time.time(), 0
while True:
    stop.fill_(float(time.time() - start >= SECS))
    dist.all_reduce(stop)
    if stop.item() > 0:
        break
    train_step().item()
    steps += 1
if rank == 0:
    print(f"steps {steps}", flush=True)
dist.destroy_process_group()
