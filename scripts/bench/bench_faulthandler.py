#!/usr/bin/env python3
"""Start-to-exit of a 2-rank job of an empty Python script under toporun with
`--faulthandler on` (PYTHONFAULTHANDLER=1 in the ranks) and `off`, interleaved in one
run (ratios: shared machines are noisy). faulthandler costs nothing until a crash.

Usage: scripts/bench/bench_faulthandler.py [--toporun PATH] [-n N]"""
import argparse, os, statistics, subprocess, sys, tempfile, time


def once(toporun, mode, script):
    t = time.perf_counter()
    subprocess.run([toporun, "--standalone", "--nproc-per-node=2", "--nccl-report=off",
                    f"--faulthandler={mode}", script], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--toporun", default=os.path.join(here, "..", "..", "target", "release", "toporun"))
    ap.add_argument("-n", type=int, default=20)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "noop.py")
        open(script, "w").write("pass\n")
        runs = {"on": [], "off": []}
        once(a.toporun, "on", script)  # warm-up
        for _ in range(a.n):
            for mode in ("on", "off"):
                runs[mode].append(once(a.toporun, mode, script))
    on, off = (statistics.median(runs[m]) for m in ("on", "off"))
    print(f"faulthandler on: {on*1000:.0f} ms, off: {off*1000:.0f} ms (median of {a.n}); on/off {on/off:.3f}")


if __name__ == "__main__":
    sys.exit(main())
