"""A rank for scripts/device/gpu_plugin_safety.sh: NCCL communicators made and torn
down while the job trains, as the plugin's teardown must survive them.
  CASE=churn  CYCLES cycles; each one, with 16 MiB all_reduces on the world group
              around it: a new group (every rank) used and destroyed; one split to
              share its parent's proxy thread (NCCL's splitShare) used and destroyed;
              one where rank 0 alone starts a collective its peer never joins and
              every rank aborts the group mid-collective (what the watchdog does)
  CASE=many   GROUPS more groups live at once beside the world's (40 communicators
              with the default 39), each used; then rank HOLD_RANK blocks in a read
              before the world's next all_reduce, which the others wait in
Prints `churn: N cycles in S s` at the end, `hold: ...` on stderr when it holds."""
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

env = os.environ.get
CASE, CYCLES, GROUPS = env("CASE", "churn"), int(env("CYCLES", "300")), int(env("GROUPS", "39"))
HOLD_RANK = int(env("HOLD_RANK", "1"))


def options(share):
    opts = dist.ProcessGroupNCCL.Options()
    if share:
        try:
            opts.config.split_share = 1
        except AttributeError:
            print("this torch has no split_share: a plain split", file=sys.stderr)
    return opts


def used(group, t):
    dist.all_reduce(t, group=group)
    torch.cuda.synchronize()


def abort(group):
    if hasattr(c10d, "_abort_process_group"):
        c10d._abort_process_group(group)
    else:
        group._get_backend(torch.device("cuda")).abort()


def churn(world, t, small):
    start = time.monotonic()
    for i in range(CYCLES):
        used(world, t)
        kind = i % 3
        g = dist.new_group(backend="nccl", pg_options=options(kind == 1))
        used(g, small)
        if kind == 2:
            # Rank 0's all_reduce waits on the GPU for a peer that never joins; the
            # group is aborted from under it.
            if dist.get_rank() == 0:
                dist.all_reduce(small, group=g, async_op=True)
                time.sleep(0.05)
            abort(g)
            torch.cuda.synchronize()
        else:
            dist.destroy_process_group(g)
        used(world, t)
        if i % 50 == 0:
            print(f"rank {dist.get_rank()} cycle {i} at {time.monotonic() - start:.1f}s", file=sys.stderr, flush=True)
    dist.barrier()
    print(f"churn: {CYCLES} cycles in {time.monotonic() - start:.1f} s", flush=True)


def many(world, t, small):
    groups = [dist.new_group(backend="nccl") for _ in range(GROUPS)]
    for step in range(30):
        for g in groups:
            used(g, small)
        used(world, t)
    print(f"many: {GROUPS + 1} communicators live, 30 steps", flush=True)
    for step in range(10_000):
        if dist.get_rank() == HOLD_RANK and step == 20:
            print(f"hold: rank {HOLD_RANK} blocks in a read with {GROUPS + 1} communicators live", file=sys.stderr, flush=True)
            r, _ = os.pipe()
            os.read(r, 1)
        used(groups[step % GROUPS], small)
        used(world, t)


def main():
    local = int(env("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    world = dist.group.WORLD
    t = torch.ones(4 << 20, device="cuda")
    small = torch.ones(1024, device="cuda")
    {"churn": churn, "many": many}[CASE](world, t, small)
    dist.destroy_process_group()


main()
