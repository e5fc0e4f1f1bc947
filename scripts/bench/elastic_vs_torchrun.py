#!/usr/bin/env python3
"""Membership failures under toporun and under torchrun, same scenario, same run:
seconds from the failure to the first training step of the next round, and how each
node ended. c10d on loopback, gloo workers (launcher/tests/scripts/elastic_steps.py).

Usage: TOPORUN=target/release/toporun python3 scripts/bench/elastic_vs_torchrun.py
(PYTHON: the virtualenv with torch, default ~/.cache/toporun-venv/bin/python)
"""
import os, signal, socket, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "launcher", "tests", "scripts")
PY = os.environ.get("PYTHON", os.path.expanduser("~/.cache/toporun-venv/bin/python"))
TOPORUN = os.environ.get("TOPORUN", os.path.join(ROOT, "target", "release", "toporun"))
TORCHRUN = [PY, "-m", "torch.distributed.run"]
# Keep-alives as in the tests: every second, lost after two misses.
CONF = "keep_alive_interval=1,keep_alive_max_attempt=2,last_call_timeout=1,join_timeout=60"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Job:
    def __init__(self, launcher, nnodes, extra, env, conf=CONF):
        self.dir = tempfile.mkdtemp()
        port = free_port()
        self.port = port
        self.cmd = (TORCHRUN if launcher == "torchrun" else [TOPORUN]) + [
            f"--nnodes={nnodes}", "--nproc-per-node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=cmp{port}",
            f"--rdzv-conf={conf}", "--monitor-interval=0.2", *extra, "elastic_steps.py"]
        self.env = dict(os.environ, PROBE_OUT=self.dir, PYTHON_EXEC=PY, **env)
        self.nodes = []

    def node(self):
        err = open(os.path.join(self.dir, f"node{len(self.nodes)}.err"), "w")
        p = subprocess.Popen(self.cmd, cwd=SCRIPTS, env=self.env, stdout=subprocess.DEVNULL,
                             stderr=err, start_new_session=True)
        self.nodes.append(p)
        return p

    def steps(self):
        try:
            lines = open(os.path.join(self.dir, "steps")).read().split("\n")
        except FileNotFoundError:
            return []
        return [l.split() for l in lines if len(l.split()) == 6]

    def wait_steps(self, world, limit=90):
        t = time.time()
        while not any(int(s[1]) == world for s in self.steps()):
            if time.time() - t > limit:
                raise SystemExit(f"no step of world {world} within {limit}s: {self.cmd}")
            time.sleep(0.05)

    def first_step_after(self, at, world):
        steps = self.steps()
        old = {s[5] for s in steps if float(s[0]) <= at}
        later = [float(s[0]) - at for s in steps
                 if float(s[0]) > at and int(s[1]) == world and s[5] not in old]
        return min(later) if later else None

    def kill(self, p):
        """The launcher and every process under it, as a node's death takes them
        (torchrun's workers run in sessions of their own)."""
        tree, todo = [], [p.pid]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            kids = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)],
                                  capture_output=True, text=True).stdout.split()
            todo.extend(int(k) for k in kids)
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait()

    def hosting(self, p):
        """Whether this node hosts the c10d store (it holds the endpoint's port)."""
        port = self.port
        out = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout
        return any(f":{port} " in l and f"pid={p.pid}," in l for l in out.splitlines())

    def finish(self, limit=90):
        codes = []
        for p in self.nodes:
            if p.returncode is not None and p.returncode < 0:
                continue  # killed by the scenario
            try:
                codes.append(p.wait(timeout=limit))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                codes.append("hung")
        return codes


def killed_and_replaced(launcher):
    """Two nodes; the one not hosting the store is killed and started again 8 s later
    (default keep-alives, as a pod restarted by Kubernetes)."""
    job = Job(launcher, "2", ["--max-restarts=3"], {"STEPS": "60", "STEP_SECS": "0.2"},
              conf="last_call_timeout=1,join_timeout=60")
    a, b = job.node(), job.node()
    job.wait_steps(2)
    time.sleep(1)
    victim = b if job.hosting(a) else a
    at = time.time()
    job.kill(victim)
    time.sleep(8)
    job.node()
    codes = job.finish()
    return job.first_step_after(at, 2), codes


def lost_in_a_quiet_phase(launcher):
    """Three nodes for --nnodes 2 (one spare); a running node is killed while the
    ranks do no collective (data loading, checkpointing)."""
    job = Job(launcher, "2", ["--max-restarts=3"],
              {"STEPS": "60", "STEP_SECS": "0.25", "QUIET": "1"})
    a, b = job.node(), job.node()
    job.wait_steps(2)
    job.node()
    time.sleep(3)
    victim = b if job.hosting(a) else a
    at = time.time()
    job.kill(victim)
    codes = job.finish()
    return job.first_step_after(at, 2), codes


def scale_up(launcher):
    """--nnodes 1:2, the second node comes while the first trains."""
    job = Job(launcher, "1:2", [], {"STEPS": "30", "STEP_SECS": "0.25"})
    job.node()
    job.wait_steps(1)
    at = time.time()
    job.node()
    codes = job.finish()
    return job.first_step_after(at, 2), codes


def store_host_lost(launcher):
    """Three nodes (--nnodes 2:3); the node hosting the c10d store is killed."""
    job = Job(launcher, "2:3", ["--max-restarts=3"], {"STEPS": "40", "STEP_SECS": "0.25"})
    nodes = [job.node() for _ in range(3)]
    job.wait_steps(3)
    time.sleep(1)
    host = next(p for p in nodes if job.hosting(p))
    at = time.time()
    job.kill(host)
    t = time.time()
    codes = job.finish()
    return job.first_step_after(at, 2), codes + [f"ended {time.time() - t:.1f}s after"]


SCENARIOS = [killed_and_replaced, lost_in_a_quiet_phase, scale_up, store_host_lost]

if __name__ == "__main__":
    only = sys.argv[1:]
    for scenario in SCENARIOS:
        if only and scenario.__name__ not in only:
            continue
        for launcher in ("toporun", "torchrun"):
            start = time.time()
            first, codes = scenario(launcher)
            took = "no next round" if first is None else f"{first:.1f} s"
            print(f"{scenario.__name__:22} {launcher:8} first step of the next round: {took:14} "
                  f"exits {codes} (scenario {time.time() - start:.0f} s)", flush=True)
