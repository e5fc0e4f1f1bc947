"""A data-parallel job on NCCL for scripts/device/gpu_nccl_straggler.sh: each step every rank
runs WORK matmuls of SIZE x SIZE (bf16) and all_reduces BUCKETS gradient buckets of
BUCKET_MIB each, as DDP does, then reads its loss; rank SLOW_RANK runs FACTOR times the
matmuls (uneven batches, a slow GPU). CKPT_EVERY s (0: never) every rank pauses
CKPT_S s in save_checkpoint. Runs SECS s (the ranks agree when to stop: one more
small all_reduce a step). PAUSE_S s (0: never) after PAUSE_AT s, rank PAUSE_RANK spends
PAUSE_S s in own_work (Python on its CPU) while the others wait in their next
all_reduce, as a rank-0-only evaluation does. Rank 0 prints the mean step time (ms) of
the steps after the first 20%, outside the checkpoints, and with STEP_LOG set writes
each step's end (s since start) and duration (ms) there, one step a line."""
import os
import time

import torch
import torch.distributed as dist

env = os.environ.get
SIZE, WORK = int(env("SIZE", "4096")), int(env("WORK", "2"))
BUCKETS, BUCKET_MIB = int(env("BUCKETS", "5")), int(env("BUCKET_MIB", "4"))
SLOW_RANK, FACTOR = int(env("SLOW_RANK", "-1")), int(env("FACTOR", "1"))
SECS, CKPT_EVERY, CKPT_S = float(env("SECS", "30")), float(env("CKPT_EVERY", "0")), float(env("CKPT_S", "3"))
PAUSE_RANK, PAUSE_AT, PAUSE_S = int(env("PAUSE_RANK", "-1")), float(env("PAUSE_AT", "20")), float(env("PAUSE_S", "0"))


def forward_backward(a, work):
    for _ in range(work):
        a = torch.tanh(a @ a)
    return a


def own_work(secs):
    end, n = time.time() + secs, 0
    while time.time() < end:
        n += sum(i * i for i in range(1000))
    return n


def save_checkpoint(state):
    torch.save({k: v.cpu() for k, v in state.items()}, f"/tmp/ckpt-{dist.get_rank()}.pt")
    time.sleep(CKPT_S)


local = int(env("LOCAL_RANK"))
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
rank = dist.get_rank()
work = WORK * (FACTOR if rank == SLOW_RANK else 1)
a = torch.randn(SIZE, SIZE, device="cuda", dtype=torch.bfloat16) / SIZE ** 0.5
grads = [torch.ones(BUCKET_MIB << 18, device="cuda") for _ in range(BUCKETS)]
times, ends, start, last_ckpt = [], [], time.time(), time.time()
# The ranks stop together: a time limit read on each rank alone gave them different
# step counts, and the last collectives of one rank waited forever (2x H100, first run).
stop = torch.zeros(1, device="cuda")
while True:
    stop.fill_(float(time.time() - start >= SECS))
    dist.all_reduce(stop)
    if stop.item() > 0:
        break
    t = time.perf_counter()
    out = forward_backward(a, work)
    for g in grads:
        dist.all_reduce(g)
    out.float().mean().item()
    times.append(time.perf_counter() - t)
    if rank == PAUSE_RANK and PAUSE_S and time.time() - start > PAUSE_AT:
        own_work(PAUSE_S)
        PAUSE_S = 0
    if CKPT_EVERY and time.time() - last_ckpt > CKPT_EVERY:
        save_checkpoint({"a": a})
        last_ckpt = time.time()
    ends.append(time.time() - start)
kept = times[len(times) // 5:]
if rank == 0:
    print(f"step_ms {1000 * sum(kept) / len(kept):.3f} steps {len(times)}", flush=True)
    if env("STEP_LOG"):
        with open(env("STEP_LOG"), "w") as f:
            f.writelines(f"{e:.4f} {1000 * d:.3f}\n" for e, d in zip(ends, times))
dist.destroy_process_group()
