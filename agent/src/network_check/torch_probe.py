"""toporun's network check through torch.distributed: one process per node, run by the
ranks' interpreter with the ranks' NCCL variables, before the ranks start.

It imports torch and says `ready` (or `unable`, and why) as one JSON line, then reads
one JSON line of parameters (the workers' store, a key prefix, this node's rank, the
phases of paths). Each path is measured by its receiver: five ping-pongs, then chunks
growing 4x until one takes ENOUGH_S, each asked for by a flag the receiver sends (the
chunk's size in KiB, 0 to end), so the sender never runs ahead and the timing holds
one transfer. A chunk that would end the path is timed again, once, where it may hold
a pause (the first chunk, or one at under half the rate of the smaller one before it)
and the path has had less than RETRY_BUDGET_S; the quicker counts, and where it is
under ENOUGH_S the chunks grow on. One pause of a process on a busy host (tens of ms)
would otherwise end the path on its first small chunk at a tenth of the link's rate.
The receiver says `begin` before each path and `path` with its figure after, so that what was measured
survives a peer that fails later; then `result` (or `failed`), and it exits. The agent
kills it past a deadline.
"""

import inspect
import json
import os
import re
import sys
import time
from datetime import timedelta

PINGS = 5
FIRST_CHUNK = 256 * 1024
LAST_CHUNK = 256 * 1024 * 1024
ENOUGH_S = 0.025
RETRY_BUDGET_S = 0.5


def say(kind, **fields):
    sys.stdout.write(json.dumps(dict(kind=kind, **fields)) + "\n")
    sys.stdout.flush()


def chunks():
    size = FIRST_CHUNK
    while size <= LAST_CHUNK:
        yield size
        size *= 4


class Link:
    """send/recv on one device, each op finished before the next starts."""

    def __init__(self, torch, dist, device):
        self.torch, self.dist, self.device = torch, dist, device
        self.flag = torch.zeros(1, dtype=torch.int32, device=device)
        self.buf = None

    def done(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def op(self, kind, t, peer):
        if self.device.type == "cuda":
            # A batch of one runs on the group's communicator (started at init), not
            # on a two-rank one per pair that NCCL would start on first use.
            op = self.dist.P2POp(kind, t, peer)
            for work in self.dist.batch_isend_irecv([op]):
                work.wait()
        else:
            kind(t, peer)
        self.done()

    def send(self, t, peer):
        self.op(self.dist.isend if self.device.type == "cuda" else self.dist.send, t, peer)

    def recv(self, t, peer):
        self.op(self.dist.irecv if self.device.type == "cuda" else self.dist.recv, t, peer)

    def buffer(self):
        if self.buf is None:
            self.buf = self.torch.empty(LAST_CHUNK, dtype=self.torch.uint8, device=self.device)
        return self.buf

    def say_flag(self, value, peer):
        self.flag.fill_(value)
        self.send(self.flag, peer)


def receive(link, peer, path):
    say("begin", path=path)
    rtts = []
    for _ in range(PINGS):
        t = time.perf_counter()
        link.say_flag(1, peer)
        link.recv(link.flag, peer)
        rtts.append(time.perf_counter() - t)
    buf = link.buffer()
    gbit, spent, before = 0.0, 0.0, None
    for size in chunks():
        took = timed(link, buf, size, peer)
        spent += took
        if paused(size, took, before) and spent < RETRY_BUDGET_S:
            again = timed(link, buf, size, peer)
            spent += again
            took = min(took, again)
        gbit = rate(size, took)
        if took >= ENOUGH_S:
            break
        before = gbit
    link.say_flag(0, peer)
    say("path", path=path, gbit=gbit, rtt_us=min(rtts) * 1e6)


def rate(size, took):
    return size * 8 / took / 1e9


def paused(size, took, before):
    """A chunk that would end the path but may hold a pause: the first one (a slow
    link's, or a pause's), or one at under half the rate of the smaller chunk before
    it (a larger chunk is never slower on a link)."""
    if took < ENOUGH_S:
        return False
    return before is None or rate(size, took) < before * 0.5


def timed(link, buf, size, peer):
    """One chunk of `size` bytes asked for and received: how long it took."""
    link.say_flag(size // 1024, peer)
    t = time.perf_counter()
    link.recv(buf[:size], peer)
    return time.perf_counter() - t


def send(link, peer):
    for _ in range(PINGS):
        link.recv(link.flag, peer)
        link.send(link.flag, peer)
    buf = link.buffer()
    while True:
        link.recv(link.flag, peer)
        kib = int(link.flag.item())
        if kib <= 0 or kib * 1024 > LAST_CHUNK:
            return
        link.send(buf[: kib * 1024], peer)


def network_of(debug_file):
    """The network NCCL chose, from its own log of this process."""
    try:
        with open(debug_file, errors="replace") as f:
            found = re.findall(r"Using network (\S+)", f.read())
        os.unlink(debug_file)
    except OSError:
        return None
    return found[-1] if found else None


def measure(torch, dist, p):
    # The round's variables (co-location's NCCL_HOSTID...), before NCCL reads its own.
    os.environ.update(p.get("env", {}))
    store = dist.TCPStore(
        p["host"], p["port"], is_master=False, timeout=timedelta(seconds=p["timeout_s"])
    )
    store = dist.PrefixStore(p["prefix"], store)
    backend = p["backend"]
    device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
    started = time.perf_counter()
    dist.init_process_group(
        backend,
        store=store,
        rank=p["node"],
        world_size=p["nnodes"],
        timeout=timedelta(seconds=p["timeout_s"]),
        device_id=device if backend == "nccl" else None,
    )
    link = Link(torch, dist, device)
    link.done()
    measuring = time.perf_counter()
    me = p["node"]
    for phase in p["phases"]:
        for path in phase:
            if path["to"] == me:
                receive(link, path["from"], path)
            elif path["from"] == me:
                send(link, path["to"])
    took = dict(start_s=measuring - started, measure_s=time.perf_counter() - measuring)
    dist.destroy_process_group()
    net = network_of(p["debug_file"]) if backend == "nccl" else None
    return net, took


def main():
    try:
        import torch
        import torch.distributed as dist
    except Exception as e:  # noqa: BLE001: any import failure means no torch path
        say("unable", why=f"cannot import torch.distributed: {e}")
        return
    backend = sys.argv[1] if len(sys.argv) > 1 else "nccl"
    try:
        if backend == "nccl":
            if not torch.cuda.is_available() or not dist.is_nccl_available():
                say("unable", why="torch has no CUDA or no NCCL here")
                return
            # One communicator for every path needs init_process_group's device_id.
            if "device_id" not in inspect.signature(dist.init_process_group).parameters:
                say("unable", why=f"torch {torch.__version__} cannot start NCCL at init (device_id)")
                return
            torch.cuda.set_device(0)
            torch.zeros(1, device="cuda")
    except Exception as e:  # noqa: BLE001
        say("unable", why=f"CUDA did not start: {e}")
        return
    say("ready", torch=torch.__version__)
    line = sys.stdin.readline()
    if not line.strip():
        return
    try:
        net, took = measure(torch, dist, json.loads(line))
    except Exception as e:  # noqa: BLE001: said to the agent, which names it
        say("failed", why=f"{type(e).__name__}: {e}")
        return
    say("result", net=net, **took)
    # The agent waits for this process to be gone before the ranks start: skip the
    # interpreter's teardown of torch (the driver releases the context at exit).
    os._exit(0)


if __name__ == "__main__":
    main()
