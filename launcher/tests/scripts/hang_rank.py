"""Ranks for the hang tests (gloo). MODE=hang: rank 3 waits in a function of its own
before an all_reduce the others entered. compute: every rank loops in Python for
SECS. print: rank 0 prints progress for SECS while the others wait in an all_reduce.
fail: rank 2 raises while the others wait in an all_reduce. Each writes its pid to
OUT/pid<rank>."""
import os
import time

import torch
import torch.distributed as dist


def wait_for_data():
    time.sleep(3600)


def compute(secs):
    end = time.time() + secs
    x = 0
    while time.time() < end:
        for i in range(1000):
            x += i * i
    return x


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with open(os.path.join(os.environ["OUT"], f"pid{rank}"), "w") as f:
        f.write(str(os.getpid()))
    mode = os.environ["MODE"]
    secs = float(os.environ.get("SECS", "30"))
    t = torch.ones(1)
    dist.all_reduce(t)
    if mode == "hang" and rank == 3:
        wait_for_data()
    elif mode == "compute":
        compute(secs)
    elif mode == "print" and rank == 0:
        for i in range(int(secs)):
            print(f"step {i}", flush=True)
            time.sleep(1)
    elif mode == "fail" and rank == 2:
        time.sleep(2)
        raise ValueError("bad batch shape (3, 224)")
    dist.all_reduce(t)
    dist.destroy_process_group()


main()
