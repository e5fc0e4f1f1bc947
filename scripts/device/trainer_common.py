"""What the real trainers of issue 61 share (scripts/device/gpu_trainer_*.py): the
device and backend (NCCL on a GPU, gloo on a CPU for a local smoke run), a stop that
all ranks agree on, iteration times, and the faults real jobs meet, one per run:

  FAULT=kill      rank FAULT_RANK sends itself SIGKILL at step FAULT_STEP
  FAULT=stop      ... SIGSTOP (frozen: the others wait in its next collective)
  FAULT=raise     ... raises a RuntimeError
  FAULT=exit      ... sys.exit("a message")
  FAULT=dlworker  ... SIGKILLs one of its DataLoader workers
  FAULT=skip      all ranks but FAULT_RANK all_reduce on a side group it never joins
  FAULT=noinit    rank FAULT_RANK never reaches init_process_group (blocked in a read)
  FAULT=teardown  ... queues an all_reduce on the side group (the others never join it)
                  and raises: with an operation still on its GPU, the framework's
                  cleanup (Lightning's, on any exception) tears the group down

and a straggler: SLOW_MS > 0 makes rank SLOW_RANK (1) sleep that long before each step
(a rank whose input pipeline is slow), so that the others wait for it in every step;
SLOW_GPU_MS > 0 makes rank SLOW_RANK's GPU run about that much more work before each
step (matmuls queued ahead of it: a GPU slower than its peers, its host not held).

The trainers are inputs: Lightning, Transformers, torch's FSDP2 and pipelining, as
their users run them; nothing here is toporun's."""
import os
import signal
import statistics
import sys
import time

import torch
import torch.distributed as dist

env = os.environ.get
FAULT, FAULT_RANK, FAULT_STEP = env("FAULT", ""), int(env("FAULT_RANK", "1")), int(env("FAULT_STEP", "30"))
SECS = float(env("SECS", "125"))
SLOW_RANK, SLOW_MS = int(env("SLOW_RANK", "1")), float(env("SLOW_MS", "0"))
SLOW_GPU_MS = float(env("SLOW_GPU_MS", "0"))
RANK, LOCAL_RANK = int(env("RANK", "0")), int(env("LOCAL_RANK", "0"))
GPU = torch.cuda.is_available()


def device():
    return torch.device("cuda", LOCAL_RANK) if GPU else torch.device("cpu")


def backend():
    return "nccl" if GPU else "gloo"


def before_init():
    """The `noinit` fault: the rank stays in a blocking read before the process group,
    as a rank stuck loading data or a checkpoint before init would."""
    if FAULT == "noinit" and RANK == FAULT_RANK:
        print(f"fault: rank {RANK} blocked before init_process_group", flush=True)
        r, _w = os.pipe()
        os.read(r, 1)


def init():
    before_init()
    if GPU:
        torch.cuda.set_device(LOCAL_RANK)
        dist.init_process_group("nccl", device_id=device())
    else:
        dist.init_process_group("gloo")


class Faults:
    """Injects FAULT at FAULT_STEP; `side` is made at start on every rank (a group made
    lazily would itself be a collective the skipping rank joins)."""

    def __init__(self):
        self.side = dist.new_group() if FAULT in ("skip", "teardown") else None
        if self.side is not None:
            dist.all_reduce(torch.ones(1, device=device()), group=self.side)

    def at(self, step):
        if not FAULT or step != FAULT_STEP:
            return
        if FAULT == "skip":
            if RANK != FAULT_RANK:
                print(f"fault: rank {RANK} all_reduces on the side group at step {step}", flush=True)
                dist.all_reduce(torch.ones(1, device=device()), group=self.side)
            return
        if RANK != FAULT_RANK:
            return
        print(f"fault: {FAULT} on rank {RANK} at step {step}", flush=True)
        if FAULT == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif FAULT == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif FAULT == "raise":
            raise RuntimeError(f"loss became NaN at step {step} (injected)")
        elif FAULT == "teardown":
            dist.all_reduce(torch.ones(1, device=device()), group=self.side)
            raise RuntimeError(f"loss became NaN at step {step} (injected, an all_reduce in flight)")
        elif FAULT == "exit":
            sys.exit(f"rank {RANK}: giving up at step {step}: the shard's checksum does not match")
        elif FAULT == "dlworker":
            kill_a_worker()


def kill_a_worker():
    pid = os.getpid()
    kids = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            kids += [int(p) for p in f.read().split()]
    if not kids:
        raise RuntimeError("FAULT=dlworker: this rank has no DataLoader worker to kill")
    print(f"fault: SIGKILL to DataLoader worker {kids[0]}", flush=True)
    os.kill(kids[0], signal.SIGKILL)


class Clock:
    """Iteration times, and a stop every rank agrees on (every 10 steps, the slowest
    rank's elapsed time by an all_reduce): a rank that stopped alone would hang the rest."""

    def __init__(self):
        self.start, self.t0, self.times = time.monotonic(), None, []

    def begin(self):
        self.t0 = time.monotonic()

    def end(self):
        if self.t0 is not None:
            self.times.append((time.monotonic() - self.t0) * 1000)
        self.t0 = None

    def up(self, step, group=None):
        if step % 10:
            return False
        t = torch.tensor([time.monotonic() - self.start], device=device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return t.item() >= SECS

    def report(self, name):
        kept = self.times[5:] or self.times
        if kept:
            print(f"iter: median {statistics.median(kept):.1f} ms over {len(kept)} (rank {RANK}, {name})", flush=True)


class GpuBurden:
    """SLOW_GPU_MS of extra GPU work a step on rank SLOW_RANK: bf16 matmuls, as many as
    took that long when timed at start, queued on the step's stream without waiting."""

    def __init__(self):
        self.n = 0
        if not (SLOW_GPU_MS and GPU and RANK == SLOW_RANK):
            return
        self.a = torch.randn(8192, 8192, device=device(), dtype=torch.bfloat16)
        self.out = torch.empty_like(self.a)
        self.run(5)
        torch.cuda.synchronize()
        t = time.monotonic()
        self.run(20)
        torch.cuda.synchronize()
        each = (time.monotonic() - t) / 20
        self.n = max(1, round(SLOW_GPU_MS / 1000 / each))
        print(f"slow gpu: rank {RANK} adds {self.n} matmuls of {each * 1000:.2f} ms a step", flush=True)

    def run(self, n=None):
        for _ in range(self.n if n is None else n):
            torch.mm(self.a, self.a, out=self.out)


def train(name, opt, step_fn):
    """A plain loop until the stop every rank agrees on: `step_fn()` runs a step's
    forward and backward, then the optimizer, a sync, the clock and the fault."""
    clock, faults, burden, step = Clock(), Faults(), GpuBurden(), 0
    while not clock.up(step):
        clock.begin()
        if SLOW_MS and RANK == SLOW_RANK:
            time.sleep(SLOW_MS / 1000)
        burden.run()
        step_fn()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if GPU:
            torch.cuda.synchronize()
        clock.end()
        step += 1
        faults.at(step)
    clock.report(name)
