"""Issue 49's cost measured inside one process a rank: the plugin built with the
`bench-control` feature switches what it asks of NCCL between timed blocks, so every
variant runs on the same communicators, buffers and GPU clocks (separate runs differed
by more than the plugin costs: 33-51 us for a 128 KiB all_reduce). Modes, in an order
shuffled each pass (the same on every rank):
  silent   no event asked (NCCL's activation mask empty; the plugin still loaded)
  posted   every operation counted as posted, none timed
  sampled  the rank's sampling (the default bursts)
  all      every operation's kernel channels timed
  ignored  NCCL reports every post, the plugin returns at once (NCCL's own share)
Sweep: all_reduce 8 KiB-1 GiB (MIN_BYTES-MAX_BYTES), one size after another (so that the
plugin learns each size's post rate, as in a job posting it steadily), PASSES passes a
size, each running the modes back to back (the blocks compared close in time).
Loops: DDP-like steps (2 bf16 matmuls of 4096, then 5 all_reduces of 4 MiB or 20 of
256 KiB, reading the loss), SEGMENTS segments of STEPS steps a mode (LOOPS: which,
default "train4m train256k").
Rank 0 prints, per size and mode, the median us and the median of the passes' ratios to
silent with their quartiles and the median's 95% confidence interval (order
statistics):
  sweep BYTES MODE MEDIAN_US RATIO_MEDIAN_PCT Q1_PCT Q3_PCT CI_LO_PCT CI_HI_PCT
  sweep BYTES|train KIND sampled-vs-posted - RATIO_MEDIAN_PCT Q1_PCT Q3_PCT CI_LO_PCT CI_HI_PCT
                                   (sampling's own share: sampled against posted, paired)
  train KIND MODE MEDIAN_STEP_MS RATIO_MEDIAN_PCT Q1_PCT Q3_PCT CI_LO_PCT CI_HI_PCT MAX_STEP_MS STEPS
  timed PART sampled TIMED of POSTED posted   (the bursts' share in sampled segments;
                                               PART: sweep-BYTES, or the loop)
and where the sampled steps' cost lies, against the segment's silent median:
  burst KIND quiet|bursty STEPS RATIO_MEDIAN_PCT CI_LO_PCT CI_HI_PCT
(quiet: steps in which the plugin timed nothing; bursty: those with a burst), and
the CPU each of rank 0's threads spent in each mode's blocks (NCCL's progress thread
polls while timed operations are open), thread names without their digits:
  threads PART MODE NAME CPU_MS_PER_S       (PART: sweep, or the loop)
The
plugin's period clock runs only in sampled segments (the bench switch stops it
outside), so bursts are as frequent as in a job sampling all along.
Run by toporun with the bench plugin beside it (scripts/device/gpu_profiler.sh, stage
inproc)."""
import ctypes
import os
import random
import statistics
import time

import torch
import torch.distributed as dist

MODES = ["silent", "posted", "sampled", "all", "ignored"]  # the bench switch's codes
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
rank = dist.get_rank()


def say(line):
    if rank == 0:
        print(line, flush=True)


# NCCL loaded the plugin at the communicator's init: the same library, not a new one.
dist.all_reduce(torch.ones(1, device="cuda"))
lib = ctypes.CDLL(os.environ["NCCL_PROFILER_PLUGIN"], mode=os.RTLD_NOLOAD | os.RTLD_NOW)
switch = lib.toporun_nccl_profiler_bench_mode
switch.argtypes, switch.restype = [ctypes.c_int], ctypes.c_int
timed_so_far = lib.toporun_nccl_profiler_bench_timed
timed_so_far.restype = ctypes.c_uint64


def mode(name):
    # Every rank learns whether any refused, so none is left waiting in a barrier.
    refused = torch.tensor([float(switch(MODES.index(name)) != 0)], device="cuda")
    dist.all_reduce(refused)
    if refused.item() > 0:
        raise SystemExit(f"a rank's plugin refused mode {name}: no communicator counted there?")


def threads_cpu():
    """CPU seconds so far of each of this process's threads, summed by name without
    its digits (NCCL numbers its threads); schedstat's run time, in ns."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip().rstrip("0123456789 ")
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile, or no schedstat
        out[name] = out.get(name, 0.0) + ns / 1e9
    return out


class ThreadClock:
    """Each mode's wall time and its threads' CPU time, block by block."""

    def __init__(self):
        self.cpu = {m: {} for m in MODES}
        self.wall = {m: 0.0 for m in MODES}

    def start(self):
        self.t0, self.cpu0 = time.perf_counter(), threads_cpu()

    def stop(self, m):
        self.wall[m] += time.perf_counter() - self.t0
        for name, secs in threads_cpu().items():
            self.cpu[m][name] = self.cpu[m].get(name, 0.0) + secs - self.cpu0.get(name, 0.0)

    def report(self, part):
        names = {n for m in MODES for n in self.cpu[m]}
        for name in sorted(names):
            rates = {m: 1000 * self.cpu[m].get(name, 0.0) / max(self.wall[m], 1e-9) for m in MODES}
            if max(rates.values()) >= 1.0:  # threads that ran at least 1 ms a second
                for m in MODES:
                    say(f"threads {part} {m} {name.replace(' ', '_')} {rates[m]:.1f}")


def count(var, default, least):
    n = int(os.environ.get(var, str(default)))
    if n < least:
        raise SystemExit(f"{var}={n}: at least {least}")
    return n


def spread(xs):
    """Median, quartiles, and the median's 95% confidence interval: the order
    statistics n/2 -+ 0.98 sqrt(n) (distribution-free)."""
    q = statistics.quantiles(xs, n=4)
    xs, n = sorted(xs), len(xs)
    half = 0.98 * n**0.5
    lo, hi = xs[max(0, int(n / 2 - half))], xs[min(n - 1, int(n / 2 + half + 1))]
    return f"{statistics.median(xs):+.2f} {q[0]:+.2f} {q[2]:+.2f} {lo:+.2f} {hi:+.2f}"


def ratios(xs, base):
    return [100 * (x / b - 1) for x, b in zip(xs, base)]


def report(prefix, per_mode, extra=lambda m: ""):
    """per_mode: MODE -> list of values by pass; ratios paired by pass."""
    for m in MODES:
        xs = per_mode[m]
        say(f"{prefix} {m} {statistics.median(xs):.3f} {spread(ratios(xs, per_mode['silent']))}{extra(m)}")
    say(f"{prefix} sampled-vs-posted - {spread(ratios(per_mode['sampled'], per_mode['posted']))}")


sizes = [8 << 10 << (2 * i) for i in range(9)] + [1 << 30]
sizes = [b for b in sizes if int(os.environ.get("MIN_BYTES", "0")) <= b <= int(os.environ.get("MAX_BYTES", str(sizes[-1])))]
bufs = {size: torch.ones(size // 4, device="cuda") for size in sizes}
for t in bufs.values():
    for _ in range(10):
        dist.all_reduce(t)
trials = {size: {m: [] for m in MODES} for size in sizes}
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
passes = count("PASSES", 100, 2)
clock = ThreadClock()
for size in sizes:
    # Operations timed in sampled blocks against those posted there (the switches and
    # barriers included), each part on its own: the bursts' share. The plugin's period
    # clock runs in sampled blocks only, so it is about what a steady job would time.
    share = {"timed": 0, "posted": 0}
    for npass in range(passes):
        order = MODES[:]
        random.Random(npass * 100 + size.bit_length()).shuffle(order)
        t, iters = bufs[size], max(20, min(200, (64 << 20) // size))
        for m in order:
            before = timed_so_far()  # before the switch: its all_reduce counts too
            mode(m)
            dist.barrier()
            torch.cuda.synchronize()
            clock.start()
            s.record()
            for _ in range(iters):
                dist.all_reduce(t)
            e.record()
            torch.cuda.synchronize()
            clock.stop(m)
            trials[size][m].append(s.elapsed_time(e) * 1000 / iters)
            if m == "sampled":
                share["posted"] += iters + 2
                share["timed"] += timed_so_far() - before
    say(f"timed sweep-{size} sampled {share['timed']} of {share['posted']} posted")
for size in sizes:
    report(f"sweep {size}", trials[size])
clock.report("sweep")

a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) / 64
steps = count("STEPS", 20, 1)
loops = [("train4m", 5, 4096), ("train256k", 20, 256)]
kinds = os.environ.get("LOOPS", "train4m train256k").split()
for kind, buckets, kib in [loop for loop in loops if loop[0] in kinds]:
    grads = [torch.ones(kib << 8, device="cuda") for _ in range(buckets)]
    seg = {m: [] for m in MODES}  # each segment's median step
    every = {m: [] for m in MODES}
    # Sampled steps against their segment's silent median: without a burst, with one.
    where = {"quiet": [], "bursty": []}
    share = {"timed": 0, "posted": 0}
    clock = ThreadClock()
    for nseg in range(count("SEGMENTS", 150, 2)):
        order = MODES[:]
        random.Random(1000 + nseg).shuffle(order)
        sampled_steps = []
        for m in order:
            before = timed_so_far()
            mode(m)
            dist.barrier()
            clock.start()
            times = []
            for _ in range(steps + 1):
                t0, timed0 = time.perf_counter(), timed_so_far()
                out = torch.tanh(torch.tanh(a @ a) @ a)
                for g in grads:
                    dist.all_reduce(g)
                out.sum().item()
                times.append((time.perf_counter() - t0) * 1000)
                if m == "sampled":
                    sampled_steps.append((times[-1], timed_so_far() > timed0))
            clock.stop(m)
            # The first step after a switch also waits for the barrier's stragglers.
            seg[m].append(statistics.median(times[1:]))
            every[m] += times[1:]
            if m == "sampled":
                share["timed"] += timed_so_far() - before
                share["posted"] += (steps + 1) * buckets + 2
        for ms, bursty in sampled_steps[1:]:
            where["bursty" if bursty else "quiet"].append(100 * (ms / seg["silent"][-1] - 1))
    say(f"timed {kind} sampled {share['timed']} of {share['posted']} posted")
    report(f"train {kind}", seg, lambda m: f" {max(every[m]):.1f} {len(every[m])}")
    for part, r in where.items():
        if len(r) >= 2:
            med, _, _, lo, hi = spread(r).split()
            say(f"burst {kind} {part} {len(r)} {med} {lo} {hi}")
    clock.report(kind)
mode("sampled")
dist.destroy_process_group()
