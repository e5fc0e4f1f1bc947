"""Minimal DDP training loop: runs on GPUs with NCCL, or on CPUs with gloo.

    toporun --standalone --nproc-per-node=auto examples/minimal_ddp.py
"""
import gc
import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def main():
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    model = DDP(torch.nn.Linear(64, 8).to(device), device_ids=[local] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(20):
        x = torch.randn(32, 64, device=device)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    if dist.get_rank() == 0:
        print(f"done: 20 steps on {dist.get_world_size()} rank(s), loss {loss.item():.4f}", flush=True)
    # The DDP model holds the process group and sits in a reference cycle, so only the
    # garbage collector frees it: left to the interpreter's exit, after the group is
    # destroyed, it can abort the rank ("terminate called without an active
    # exception": 8 of 32 runs under torchrun, 5 of 44 under toporun on a busy CPU;
    # none in 68 with these two lines, scripts/bench/teardown_aborts.sh).
    del model, opt, loss
    gc.collect()
    # Every rank done before any tears its process group down: gloo can abort a rank
    # whose peer closes the connections under its worker threads.
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
