"""Ranks for the hang tests (gloo). MODE=hang: rank 3 waits in a function of its own
before an all_reduce the others entered. compute: every rank loops in Python for
SECS. print: rank 0 prints progress for SECS while the others wait in an all_reduce.
fail: rank 2 raises (after FAIL_AFTER s, default 2) while the others wait in an all_reduce. frdump: ranks 0-2 enter
a 4th all_reduce that rank 3 never does, every rank dumps its flight recorder, and
rank 3 raises. stopped: rank 1 stops its own process (SIGSTOP, as `kill -STOP` or
Ctrl-Z would) before an all_reduce the others entered. killed: rank 2 is killed
(SIGKILL) while the others sit where no SIGTERM reaches them (as ranks blocked in
NCCL do: ignored here), so the stop waits out --shutdown-timeout. deaf: as hang,
every rank ignoring SIGTERM. backward: a DDP
model on the CPU; rank 1 sleeps in its own code (a batch that never comes) while
rank 0 waits in its backward for rank 1's gradients. Each writes its pid to
OUT/pid<rank>. With WATCH_DUMP_KEY=1, a thread of
rank 0 named as stock ProcessGroupNCCL's monitor writes what it finds under
`exception_dump` in the workers' store to OUT/exception_dump (the int32 rank the
monitor reads there) and dumps rank 0's flight recorder, as the monitor does."""
import os
import sys
import threading
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


def watch_dump_key(out):
    """Does what stock ProcessGroupNCCL's heartbeat monitor does, under its thread
    name: waits for `exception_dump` in the workers' store, then dumps."""
    import ctypes

    ctypes.CDLL(None).prctl(15, b"pt_nccl_heartbt", 0, 0, 0)  # PR_SET_NAME
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False
    )
    while not store.check(["exception_dump"]):
        time.sleep(0.2)
    value = int.from_bytes(store.get("exception_dump"), sys.byteorder, signed=True)
    with open(os.path.join(out, "exception_dump"), "w") as f:
        f.write(str(value))
    from torch._C._distributed_c10d import _dump_fr_trace_file

    _dump_fr_trace_file(dist.get_rank())


def ddp_step(rank):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(torch.nn.Linear(256, 256))
    for _ in range(3):
        model(torch.randn(8, 256)).sum().backward()
    if rank == 1:
        wait_for_data()
    model(torch.randn(8, 256)).sum().backward()


def main():
    dist.init_process_group("gloo")
    if os.environ.get("WATCH_DUMP_KEY") == "1" and dist.get_rank() == 0:
        threading.Thread(target=watch_dump_key, args=(os.environ["OUT"],), daemon=True).start()
    rank = dist.get_rank()
    with open(os.path.join(os.environ["OUT"], f"pid{rank}"), "w") as f:
        f.write(str(os.getpid()))
    mode = os.environ["MODE"]
    secs = float(os.environ.get("SECS", "30"))
    t = torch.ones(1)
    dist.all_reduce(t)
    if mode == "hang" and rank == 3:
        wait_for_data()
    elif mode == "deaf":
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if rank == 3:
            wait_for_data()
    elif mode == "stopped" and rank == 1:
        import signal

        os.kill(os.getpid(), signal.SIGSTOP)
    elif mode == "compute":
        compute(secs)
    elif mode == "print" and rank == 0:
        for i in range(int(secs)):
            print(f"step {i}", flush=True)
            time.sleep(1)
    elif mode == "killed":
        import signal

        if rank == 2:
            time.sleep(1)
            os.kill(os.getpid(), signal.SIGKILL)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        wait_for_data()
    elif mode == "backward":
        ddp_step(rank)
    elif mode == "fail" and rank == 2:
        # Long enough for the stacks of the others, in their all_reduce, to be
        # sampled on a loaded machine (2 s was not, once).
        time.sleep(float(os.environ.get("FAIL_AFTER", "2")))
        raise ValueError("bad batch shape (3, 224)")
    elif mode == "frdump":
        from torch._C._distributed_c10d import _dump_fr_trace_file

        dist.all_reduce(t)
        dist.all_reduce(t)
        work = dist.all_reduce(t, async_op=True) if rank != 3 else None
        _dump_fr_trace_file(rank)
        time.sleep(1)
        if rank == 3:
            raise RuntimeError("rank 3 skipped the all_reduce")
        work.wait()
    dist.all_reduce(t)
    dist.destroy_process_group()


main()
