#!/usr/bin/env python3
"""Start-to-exit of `--standalone --nproc-per-node=8 --no-python /bin/true` under toporun
and the real torchrun in the same run (ratios: shared machines are noisy): median of
N runs and peak RSS (os.wait4's ru_maxrss: the launcher or its largest child); and
toporun against the floor, a bash loop starting the same 8 /bin/true, timed in pairs
(the median of the pairs' ratios).

Usage: scripts/bench/bench_startup.py [--toporun PATH] [--torchrun PATH] [-n N] [--json]"""
import argparse, json, os, statistics, subprocess, sys, time

JOB = ["--standalone", "--nproc-per-node=8", "--no-python", "/bin/true"]
FLOOR = ["bash", "-c", "for i in 1 2 3 4 5 6 7 8; do /bin/true & done; wait"]

def once(argv, job=JOB):
    """Wall seconds and peak RSS MB of one no-op job."""
    t = time.perf_counter()
    p = subprocess.Popen(argv + job, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{argv[0]} failed with {status}")
    return wall, usage.ru_maxrss / 1024

def measure(a, b, n):
    """Medians and peaks of both launchers, their runs interleaved so that a burst of
    load on a shared machine falls on both rather than on one launcher's series."""
    runs = {0: [], 1: []}
    for _ in range(n):
        for i, argv in enumerate((a, b)):
            runs[i].append(once(argv))
    return [(statistics.median(w for w, _ in r), max(m for _, m in r)) for r in runs.values()]

def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--toporun", default=os.path.join(here, "..", "..", "target", "release", "toporun"))
    ap.add_argument("--torchrun", default=os.path.expanduser("~/.cache/toporun-venv/bin/torchrun"))
    ap.add_argument("-n", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    (tw, tr), (rw, rr) = measure([a.toporun], [a.torchrun], a.n)
    pairs = [(once([a.toporun])[0], once(FLOOR, [])[0]) for _ in range(max(a.n, 15))]
    over = statistics.median(t / f for t, f in pairs)
    res = {"runs": a.n, "toporun_s": round(tw, 4), "toporun_peak_rss_mb": round(tr, 1),
           "torchrun_s": round(rw, 3), "torchrun_peak_rss_mb": round(rr, 1), "speedup": round(rw / tw, 1),
           "floor_s": round(statistics.median(f for _, f in pairs), 4), "over_floor": round(over, 2)}
    if a.json:
        print(json.dumps(res))
        return
    print(f"{'launcher':<9} {'median s':>9} {'peak RSS MB':>12}")
    print(f"{'toporun':<9} {tw:>9.4f} {tr:>12.1f}")
    print(f"{'torchrun':<9} {rw:>9.3f} {rr:>12.1f}")
    print(f"toporun is {rw / tw:.0f}x faster from start to exit (median of {a.n})")
    print(f"toporun takes {over:.2f}x the floor, a bash loop starting the same 8 /bin/true "
          f"({res['floor_s']:.4f} s; median of {len(pairs)} pairs' ratios)")

main()
