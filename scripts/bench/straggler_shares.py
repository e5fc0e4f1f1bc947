#!/usr/bin/env python3
"""Measures what the straggler rule sees: runs 4-rank gloo jobs of
launcher/tests/scripts/straggler_rank.py under toporun (balanced, one rank with 3x
compute, an all-ranks checkpoint pause, one rank in a CPU cgroup with a quota) and
prints every rank's wait share (and in each third of the window) from `toporun top --once --format json` each 2 s,
and the straggler lines toporun said.

  scripts/bench/straggler_shares.py [--window 10] [--secs 40] [SCENARIO...]
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
SCRIPTS = ROOT / "launcher" / "tests" / "scripts"
SCENARIOS = {
    "balanced": {},
    "slow-compute": {"SLOW_RANK": "2", "FACTOR": "3"},
    "pause": {"PAUSE_AT": "12", "PAUSE": "10"},
    # straggler_e2e's balanced job: a checkpoint pause, then rank 0 logging for 3 s.
    "log": {"PAUSE_AT": "22", "PAUSE": "10", "LOG_AT": "48", "LOG_SECS": "3"},
    # The same with each step sleeping 0-80 ms as if on a GPU: the ranks leave CPU free.
    "log-gpu": {"PAUSE_AT": "22", "PAUSE": "10", "LOG_AT": "48", "LOG_SECS": "3",
                "GPU_MS": "40"},
    # The same with a third of the compute and longer GPU waits: four ranks use less
    # than half of two cores, so a slower or shared CPU does not saturate them.
    "log-gpu-light": {"PAUSE_AT": "22", "PAUSE": "10", "LOG_AT": "48", "LOG_SECS": "3",
                      "GPU_MS": "60", "STEPS": "10"},
    "cgroup": {"CGROUP_RANK": "2"},
}


def cgroup_quota(pid, name):
    d = pathlib.Path("/sys/fs/cgroup/cpu") / name
    d.mkdir(exist_ok=True)
    (d / "cpu.cfs_quota_us").write_text("15000")  # 15% of a core
    (d / "cgroup.procs").write_text(str(pid))
    return d


def share(w):
    """A rank's wait share over the window (in its thirds, oldest first)."""
    if w is None:
        return "  -             "
    t = "/".join(f"{x * 100:2.0f}" for x in w.get("thirds", [0, 0, 0]))
    return f"{w['wait'] * 100:3.0f}% ({t}) cpu {w.get('cpu_pct') or 0:3.0f}"


def gaps(windows):
    """Each rank's points below the others' median: whole window / smallest of the
    thirds (what the rule compares against 20 points)."""
    def below(rank, pick):
        others = sorted(pick(w) for r, w in windows.items() if r != rank)
        mid = len(others) // 2
        m = others[mid] if len(others) % 2 else (others[mid - 1] + others[mid]) / 2
        return (m - pick(windows[rank])) * 100

    out = []
    for r in sorted(windows):
        whole = below(r, lambda w: w["wait"])
        third = min(below(r, lambda w, t=t: w["thirds"][t]) for t in range(3))
        out.append(f"{r}:{whole:+4.0f}/{third:+4.0f}")
    return "  ".join(out)


def run(name, env_extra, window, secs, toporun, python):
    out = tempfile.mkdtemp()
    env = dict(os.environ, SECS=str(secs), OUT=out, PYTHON_EXEC=python, **env_extra)
    cmd = [toporun, "--standalone", "--nproc-per-node=4", "--nccl-report=off",
           f"--straggler-window={window}", "--log-dir", out + "/logs", "straggler_rank.py"]
    p = subprocess.Popen(cmd, cwd=SCRIPTS, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    cg = None
    start = time.time()
    rows = []
    while p.poll() is None:
        time.sleep(2)
        if "CGROUP_RANK" in env_extra and cg is None:
            pid = pathlib.Path(out, "pid" + env_extra["CGROUP_RANK"])
            if pid.exists():
                cg = cgroup_quota(int(pid.read_text()), f"toporun-shares-{os.getpid()}")
        runs = list(pathlib.Path(out, "logs").glob("*"))
        if not runs:
            continue
        r = subprocess.run([toporun, "top", "--once", "--format", "json", str(runs[0])],
                           capture_output=True, text=True)
        try:
            t = json.loads(r.stdout)
        except json.JSONDecodeError:
            continue
        windows = {x["rank"]: x.get("window") for x in t["ranks"]}
        if any(v is not None for v in windows.values()):
            line = " ".join(f"{k}:" + share(v) for k, v in sorted(windows.items()))
            rows.append(f"  t={time.time() - start:5.1f}s {line}")
            if all(v is not None for v in windows.values()):
                rows.append("           gap " + gaps(windows))
    err = p.stderr.read()
    if cg is not None:
        try:
            cg.rmdir()
        except OSError:
            pass
    print(f"{name}: exit {p.returncode}")
    print("\n".join(rows))
    said = [l for l in err.splitlines() if "straggler" in l or l.startswith("  its ")]
    print("  said:" + ("".join("\n    " + l for l in said) if said else " nothing"))


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--window", default="10")
    a.add_argument("--secs", default="40")
    a.add_argument("--toporun", default=str(ROOT / "target" / "debug" / "toporun"))
    a.add_argument("--python", default=os.environ.get("TOPORUN_PYTHON", "python3"))
    a.add_argument("scenarios", nargs="*", default=list(SCENARIOS))
    o = a.parse_args()
    for s in o.scenarios:
        run(s, SCENARIOS[s], o.window, o.secs, o.toporun, o.python)


if __name__ == "__main__":
    sys.exit(main())
