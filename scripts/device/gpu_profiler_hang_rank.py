"""A rank for scripts/device/gpu_profiler.sh: NCCL training steps (matmuls, 5 all_reduces
of 4 MiB, the loss read) for WARM s, then rank HOLD_RANK leaves the loop as CASE says
while the others go on into the next step's all_reduce and wait there:
  spin   parse_records loops on a record whose cursor never advances (Python, one core)
  stuck  read_shard blocks in a read of a pipe nobody writes
  eval   evaluate: Python and small GPU work for EVAL_S s, then the job goes on for
         AFTER s (a rank-0-only evaluation longer than --hang-timeout)
It prints `hold: rank R starts CASE` on stderr when it leaves the loop."""
import os
import sys
import time

import torch
import torch.distributed as dist

env = os.environ.get
CASE, HOLD_RANK = env("CASE", "spin"), int(env("HOLD_RANK", "1"))
WARM, EVAL_S, AFTER = float(env("WARM", "8")), float(env("EVAL_S", "35")), float(env("AFTER", "8"))


def parse_record(buf, pos):
    # The bug: a zero-length record leaves the cursor where it was.
    length = buf[pos]
    return buf[pos + 1:pos + 1 + length], pos + length


def parse_records(buf):
    pos, out = 0, 0
    while pos < len(buf):
        rec, pos = parse_record(buf, pos)
        out += len(rec)
    return out


def read_shard():
    r, w = os.pipe()
    return os.read(r, 1)


def evaluate(a, secs):
    end, score = time.time() + secs, 0.0
    while time.time() < end:
        score += sum(i * 0.5 for i in range(20000))
        score += float((a[:256, :256] @ a[:256, :256]).sum())
    return score


def step(a, grads):
    out = torch.tanh(a @ a)
    for g in grads:
        dist.all_reduce(g)
    return out.float().mean().item()


def run_for(a, grads, secs):
    """Steps for `secs`; every rank stops after the same step (a time read on each rank
    alone gave them different step counts: their collectives then do not match)."""
    end, stop = time.time() + secs, torch.zeros(1, device="cuda")
    while True:
        stop.fill_(float(time.time() >= end))
        dist.all_reduce(stop)
        if stop.item() > 0:
            return
        step(a, grads)


local = int(env("LOCAL_RANK"))
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
rank = dist.get_rank()
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) / 64
grads = [torch.ones(1 << 20, device="cuda") for _ in range(5)]
run_for(a, grads, WARM)
if rank == HOLD_RANK:
    print(f"hold: rank {rank} starts {CASE}", file=sys.stderr, flush=True)
    if CASE == "spin":
        parse_records(bytes([0, 3, 1, 2, 3]))
    elif CASE == "stuck":
        read_shard()
    elif CASE == "eval":
        evaluate(a, EVAL_S)
        print(f"hold: rank {rank} evaluation done", file=sys.stderr, flush=True)
# The others wait in the next step's first all_reduce for the rank that holds.
run_for(a, grads, AFTER)
if rank == 0:
    print("done", flush=True)
dist.destroy_process_group()
