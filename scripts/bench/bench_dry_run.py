#!/usr/bin/env python3
"""Median wall time of `toporun launch --dry-run` on a fixture host.
Usage: scripts/bench/bench_dry_run.py [--toporun PATH] [--facts FILE] [-n N]"""
import argparse, os, statistics, subprocess, time

here = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("--toporun", default=os.path.join(here, "..", "..", "target", "release", "toporun"))
ap.add_argument("--facts", default=os.path.join(here, "..", "..", "tests", "fixtures", "hosts", "p5.48xlarge.json"))
ap.add_argument("-n", type=int, default=21)
a = ap.parse_args()
times = []
for _ in range(a.n):
    t = time.perf_counter()
    subprocess.run([a.toporun, "launch", "--dry-run", "--facts", a.facts, "--nproc-per-node=gpu", "train.py"], stdout=subprocess.DEVNULL, check=True)
    times.append(time.perf_counter() - t)
print(f"launch --dry-run: median {statistics.median(times) * 1000:.2f} ms over {a.n} (min {min(times) * 1000:.2f}, max {max(times) * 1000:.2f})")
