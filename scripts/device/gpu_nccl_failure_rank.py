"""NCCL failures as user code meets them, one rank per GPU (scripts/device/gpu_nccl_failures.sh).
Every rank trains a small model: a matmul, the gradient's all_reduce (2048x2048), the
loss read back with .item(); at step FAIL_STEP (12) rank FAIL_RANK (1) does what CASE
says:
  leaver      stops early (its own early-stopping rule) and exits 0; the others go on
  stuck       blocks in a read that never returns (read_next_shard); the others wait
              on their GPU at loss.item()
  metrics     rank 0 alone reduces a metric ([1]); the others go on to the next
              gradient ([2048, 2048])
  skip        skips one gradient all_reduce; every rank runs STEPS (30) steps and
              exits, the others one all_reduce short of a partner
  skipgrad    each step also reduces the loss ([1]) after the gradient; rank FAIL_RANK
              skips the gradient's all_reduce once: its later operations are the
              others' shifted by one, of other sizes
  sysexit     quits with sys.exit("config error: lr must be positive") (no traceback)
  sidebusy    every rank's metrics thread all_reduces on a side group every 10 ms
              from the start; at FAIL_STEP rank FAIL_RANK blocks in a read as stuck:
              the side group keeps moving while the gradients' group hangs
  watchdog    as stuck, under a process group timeout of PG_TIMEOUT s (25): NCCL's
              watchdog aborts the waiting rank
  sideskip    skipgrad beside sidebusy's metrics thread, under PG_TIMEOUT (25): the
              gradients' group stands at operations of other sizes while the side
              group moves (the counters cannot judge that; the watchdog ends it)
  segv        a native crash (ctypes reads address 8) in decode_native_record
  valueerror  raises ValueError in load_batch
  oom         asks CUDA for more memory than the GPU has in build_activations
  dataloader  one of its DataLoader workers is killed (SIGKILL)
  none        trains STEPS steps and exits 0
DEVICE=cpu runs the same on CPU ranks over gloo (to try the script without a GPU)."""
import ctypes
import datetime
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

CASE = os.environ.get("CASE", "none")
FAIL_STEP = int(os.environ.get("FAIL_STEP", "12"))
FAIL_RANK = int(os.environ.get("FAIL_RANK", "1"))
STEPS = int(os.environ.get("STEPS", "30" if CASE in ("skip", "none") else "100000"))


class Shards(torch.utils.data.Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        if CASE == "dataloader" and int(os.environ["RANK"]) == FAIL_RANK and i == FAIL_STEP * 4:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.full((16,), float(i % 7))


def read_next_shard():
    r, w = os.pipe()  # the writer is never written: as a stalled network read
    return os.read(r, 1)


def decode_native_record(ptr):
    return ctypes.string_at(ptr, 8)


def load_batch(step):
    raise ValueError(f"batch {step}: expected 16 features, got 15")


def build_activations():
    return torch.empty(200 << 30, dtype=torch.uint8, device="cuda" if torch.cuda.is_available() else "cpu")


def train_step(w, x):
    g = (x @ w).mul_(1e-3)
    return g, g.float().pow(2).mean()


def start_metrics_thread(side, dev, local):
    """A background thread reducing a metric on its own group every 10 ms, as a
    metrics or heartbeat thread does: NCCL posts on that communicator never stop."""

    def loop():
        if dev == "cuda":
            torch.cuda.set_device(local)
            # Its own stream: on the default one beside the gradients' group, the two
            # groups' kernels are ordered differently on each rank and deadlock (what
            # the first run of this case did, before any rank held).
            torch.cuda.set_stream(torch.cuda.Stream())
        m = torch.ones(1, device=dev)
        while True:
            dist.all_reduce(m, group=side)
            m.fill_(1.0)
            time.sleep(0.01)

    threading.Thread(target=loop, daemon=True, name="metrics").start()


def main():
    local = int(os.environ["LOCAL_RANK"])
    timeout = datetime.timedelta(seconds=int(os.environ.get("PG_TIMEOUT", "25"))) if CASE in ("watchdog", "sideskip") else None
    if os.environ.get("DEVICE") == "cpu":
        dist.init_process_group("gloo", timeout=timeout)
        dev, n = "cpu", 256
    else:
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local), timeout=timeout)
        dev, n = "cuda", 2048
    rank = dist.get_rank()
    w = torch.randn(n, n, device=dev)
    x = torch.randn(n, n, device=dev)
    if CASE in ("sidebusy", "sideskip"):
        start_metrics_thread(dist.new_group(), dev, local)
    loader = iter(torch.utils.data.DataLoader(Shards(), batch_size=4, num_workers=2 if CASE == "dataloader" else 0))
    for step in range(STEPS):
        next(loader)
        failing = rank == FAIL_RANK and step == FAIL_STEP
        if failing and CASE == "leaver":
            print(f"rank {rank}: early stop at step {step}: validation loss stopped improving", flush=True)
            return
        if failing and CASE == "sysexit":
            sys.exit("config error: lr must be positive")
        if failing and CASE in ("stuck", "watchdog", "sidebusy"):
            read_next_shard()
        if failing and CASE == "segv":
            decode_native_record(8)
        if failing and CASE == "valueerror":
            load_batch(step)
        if failing and CASE == "oom":
            build_activations()
        g, loss = train_step(w, x)
        if not (failing and CASE in ("skip", "skipgrad", "sideskip")):
            dist.all_reduce(g)
        if CASE in ("skipgrad", "sideskip"):
            dist.all_reduce(loss.detach().reshape(1))
        if CASE == "metrics" and rank == 0 and step == FAIL_STEP:
            m = loss.detach().reshape(1)
            dist.all_reduce(m)  # metrics reduced on rank 0 only
        w.sub_(g, alpha=1e-6)
        loss.item()
        time.sleep(0.02)
    print(f"rank {rank}: done {STEPS} steps", flush=True)


main()
if dist.is_initialized():
    dist.destroy_process_group()
