"""Where a job's step time goes: reads STEP_LOG files of scripts/device/gpu_nccl_straggler_rank.py
(end s, duration ms a line) and prints, per file, the median step and the mean of the
steps that ended after FROM s (the steady state), and the steps over twice the median
(stalls: a dump, a checkpoint) with when they ended and what they cost beyond the median.
Usage: python3 scripts/bench/step_stalls.py [--from S] LOG[:DUMPS]..., DUMPS the dumps taken"""
import statistics
import sys

args, start = sys.argv[1:], 0.0
if args[:1] == ["--from"]:
    start, args = float(args[1]), args[2:]
for arg in args:
    log, _, dumps = arg.partition(":")
    steps = [tuple(map(float, line.split())) for line in open(log) if line.strip()]
    med = statistics.median(d for _, d in steps)
    steady = [d for e, d in steps if e >= start]
    stalls = [(e, d) for e, d in steps if d > 2 * med]
    excess = sum(d - med for _, d in stalls) / 1000
    at = " ".join(f"{e:.0f}" for e, _ in stalls[:12])
    print(f"{log}: median {med:.2f} ms, mean from {start:.0f} s {statistics.mean(steady):.2f} ms "
          f"over {len(steady)} steps; {len(stalls)} stalls > 2x median costing {excess:.2f} s "
          f"(ending at s: {at}){f'; {dumps} dumps' if dumps else ''}")
