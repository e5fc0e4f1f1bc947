"""busbw per size and tag from allreduce_bench.py RESULT lines (a file): the median of
the runs (each run's figure is the median of its three trials), and plan / default."""
import json, sys
import re, statistics
runs = {}
for line in open(sys.argv[1]):
    if not line.startswith("RESULT "):
        continue
    tag = line.split()[1]
    # Sizes and busbw read field by field: a line cut short still gives its sizes.
    for mib, bus in re.findall(r'"MiB": (\d+), [^{}]*?"busbw_GBps": ([\d.]+)', line):
        runs.setdefault((tag, int(mib)), []).append(float(bus))
best = {k: statistics.median(v) for k, v in runs.items()}
print("busbw GB/s, median of the runs (each run: median of 3 trials); runs per tag and size:",
      {f"{t}@{m}": v for (t, m), v in sorted(runs.items())})
tags = sorted({t for t, _ in best}, key=["default", "plan", "p2p-off", "proto-simple"].index)
sizes = sorted({m for _, m in best})
print("| MiB | " + " | ".join(tags) + " | plan / default |")
for m in sizes:
    row = [best.get((t, m), 0) for t in tags]
    ratio = best.get(("plan", m), 0) / max(best.get(("default", m), 1e-9), 1e-9)
    print(f"| {m} | " + " | ".join(f"{v:.1f}" for v in row) + f" | {ratio:.2f} |")
