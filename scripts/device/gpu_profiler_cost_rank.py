"""One run of scripts/device/gpu_profiler_cost.sh, in one process a rank (NCCL set up once):
the all_reduce sweep 8 KiB-512 MiB (CUDA-event timed, TRIALS trials a size, every rank
starting each together; MIN_BYTES-MAX_BYTES bound the sizes), then TRAIN_S s of a
DDP-like step twice (LOOPS: which, default "train4m train256k"): 2 bf16 matmuls of 4096 then 5 all_reduces of 4 MiB (`train4m`), and 20 of
256 KiB (`train256k`: many small collectives, the plugin's worst case); each step ends
reading the loss. Rank 0 prints `sweep BYTES MEDIAN_US MIN_US MAX_US` and `train KIND
MEDIAN_STEP_MS STEPS MAX_STEP_MS MEAN_STEP_MS` (of the steps after the first 20%)."""
import os
import time

import torch
import torch.distributed as dist

local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
rank = dist.get_rank()


def say(line):
    if rank == 0:
        print(line, flush=True)


# Each size: TRIALS timed runs of about 2 ms (at least 20 all_reduces), interleaved
# across sizes; the median trial counts (a trial a stack sample or a page fault hit
# says nothing of the plugin).
sizes = [8 << 10 << (2 * i) for i in range(9)]
sizes = [b for b in sizes if int(os.environ.get("MIN_BYTES", "0")) <= b <= int(os.environ.get("MAX_BYTES", str(sizes[-1])))]
bufs = {size: torch.ones(size // 4, device="cuda") for size in sizes}
for t in bufs.values():
    for _ in range(10):
        dist.all_reduce(t)
trials = {size: [] for size in sizes}
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
for npass in range(int(os.environ.get("TRIALS", "40"))):
    for size in sizes:
        t, iters = bufs[size], max(20, min(200, (64 << 20) // size))
        dist.barrier()
        torch.cuda.synchronize()
        s.record()
        for _ in range(iters):
            dist.all_reduce(t)
        e.record()
        torch.cuda.synchronize()
        trials[size].append(s.elapsed_time(e) * 1000 / iters)
for size in sizes:
    xs = sorted(trials[size])
    say(f"sweep {size} {xs[len(xs) // 2]:.2f} {xs[0]:.2f} {xs[-1]:.2f}")
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) / 64
kinds = os.environ.get("LOOPS", "train4m train256k").split()
for kind, buckets, kib in [lp for lp in [("train4m", 5, 4096), ("train256k", 20, 256)] if lp[0] in kinds]:
    grads = [torch.ones(kib << 8, device="cuda") for _ in range(buckets)]
    stop = torch.zeros(1, device="cuda")
    times, start = [], time.time()
    while True:
        # The ranks stop together (each reading its own clock would not).
        stop.fill_(float(time.time() - start >= float(os.environ.get("TRAIN_S", "6"))))
        dist.all_reduce(stop)
        if stop.item() > 0:
            break
        t = time.perf_counter()
        out = torch.tanh(torch.tanh(a @ a) @ a)
        for g in grads:
            dist.all_reduce(g)
        out.sum().item()
        times.append((time.perf_counter() - t) * 1000)
    kept = sorted(times[len(times) // 5:])
    say(f"train {kind} {kept[len(kept) // 2]:.3f} {len(times)} {kept[-1]:.1f} {sum(kept) / len(kept):.3f}")
dist.destroy_process_group()
