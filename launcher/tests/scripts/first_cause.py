"""Ranks of a 4-rank gloo job that stop as user code stops (first_cause_e2e). MODE:
leave: rank 1 takes an early-stopping branch after step 3 and exits 0. short: rank 1
runs one all_reduce fewer (one batch fewer) and finishes. segv: rank 3 crashes in a
native call (a bad pointer) at step 2. exit3: rank 3 leaves through os._exit(3) inside
a helper after step 2, with no traceback. exitmsg: rank 1 quits with
sys.exit("config error: ...") at step 2 (exit 1, the message on stderr, no
traceback). rank0_last: rank 0 finishes 1 s after the
others. uneven: every rank finishes at its own time, no collective pending. ckpt:
rank 0 saves a checkpoint into CKPT (a full volume) at step 3, through a file it
opened 1.5 s before (a slow serializer). cuda_oom: rank 0 raises PyTorch's CUDA
out-of-memory error, as torch raises it on a GPU, at step 2. worker_stuck: rank 1's
DataLoader worker blocks forever reading item 3. worker_killed: that worker is
SIGKILLed at item 3 (as the OOM killer or a crash in a decoder would).
STEP_SECS: the pause between steps (the stack sampler sees where each rank stands)."""
import ctypes
import os
import sys
import signal
import time

import torch
import torch.distributed as dist

mode = os.environ["MODE"]
pause = float(os.environ.get("STEP_SECS", "0.3"))
dist.init_process_group("gloo")
rank = dist.get_rank()


def decode_native_record(ptr):
    return ctypes.string_at(ptr, 8)  # a bad pointer (not NULL, which ctypes refuses): SIGSEGV


def read_remote_shard(i):
    if mode == "worker_stuck":
        time.sleep(3600)  # a read that never returns
    os.kill(os.getpid(), signal.SIGKILL)


class Shards(torch.utils.data.Dataset):
    def __len__(self):
        return 100

    def __getitem__(self, i):
        if i == 3:
            read_remote_shard(i)
        return torch.ones(4)


def build_activations(step):
    raise torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of 79.18 GiB of which 6.66 GiB is free. Including non-PyTorch memory, this process has 72.51 GiB memory in use. Of the allocated memory 70.10 GiB is allocated by PyTorch, and 1.90 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
    )


def save_checkpoint(step):
    with open(os.path.join(os.environ["CKPT"], f"step{step}.pt"), "wb") as f:
        time.sleep(1.5)
        torch.save({"weights": torch.ones(1 << 20)}, f)  # 4 MiB


def flush_shards(step):
    time.sleep(pause)
    os._exit(3)  # a native library's exit(): no traceback


steps = 8
batches = None
if mode.startswith("worker_") and rank == 1:
    batches = iter(torch.utils.data.DataLoader(Shards(), batch_size=1, num_workers=1))
if mode == "short" and rank == 1:
    steps -= 1
for step in range(steps):
    if mode == "leave" and rank == 1 and step == 3:
        print("rank 1: early stopping", flush=True)
        raise SystemExit(0)
    if mode == "segv" and rank == 3 and step == 2:
        time.sleep(pause)
        decode_native_record(8)
    if mode == "ckpt" and rank == 0 and step == 3:
        save_checkpoint(step)
    if mode == "cuda_oom" and rank == 0 and step == 2:
        build_activations(step)
    if mode == "exit3" and rank == 3 and step == 2:
        flush_shards(step)
    if mode == "exitmsg" and rank == 1 and step == 2:
        sys.exit("config error: lr must be positive (got -0.001)")
    t = torch.ones(4) if batches is None else next(batches)[0]
    dist.all_reduce(t)
    time.sleep(pause)
if mode == "rank0_last" and rank == 0:
    time.sleep(1)
if mode == "uneven":
    time.sleep(0.3 * rank)
print(f"rank {rank} done", flush=True)
