"""PyTorch's copy bandwidth, the reference for `toporun preflight --measure`: every
ordered GPU pair (x.to(other), issued on the source GPU as PyTorch does) and each
GPU's host<->device copies from pinned memory, timed with CUDA events, with the same
buffer size and a comparable repeat count. Prints one JSON document.
Between GPUs, each `x.to(other)` also records an event on the destination's stream and
makes the source's stream wait for it (PyTorch orders a cross-device copy against both
devices' streams), a fixed cost per copy that back-to-back copies on one stream (as
`preflight --measure` issues them) do not pay: `gbps` is the per-copy figure, `bulk_gbps`
one copy of BULK_MIB (1 GiB) into a preallocated tensor, where that cost is spread over
16x the bytes. The link's figure is the bulk one; compare_links reads it.
Usage: python3 scripts/bench/copy_bench.py [MiB]"""
import json, sys, time

t0 = time.perf_counter()
import torch

MIB = int(sys.argv[1]) if len(sys.argv) > 1 else 64
n = MIB << 20
REPS = 10
WARM = 5


def timed(stream_dev, copy):
    """Best of two runs of REPS copies, after WARM untimed ones (an idle GPU's PCIe
    link retrains to full speed under load; first use maps peer memory)."""
    with torch.cuda.device(stream_dev):
        for _ in range(WARM):
            copy()
        torch.cuda.synchronize(stream_dev)
        best = 0.0
        for _ in range(2):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(REPS):
                copy()
            stop.record()
            stop.synchronize()
            best = max(best, n * REPS / (start.elapsed_time(stop) / 1e3) / 1e9)
        return best


count = torch.cuda.device_count()
bufs = [torch.ones(n, dtype=torch.uint8, device=f"cuda:{i}") for i in range(count)]
outs = [torch.empty(n, dtype=torch.uint8, device=f"cuda:{i}") for i in range(count)]
init = time.perf_counter() - t0
BULK = 1 << 30


def bulk(a, b):
    """One copy of BULK bytes a -> b, best of three after one untimed."""
    src = torch.ones(BULK, dtype=torch.uint8, device=f"cuda:{a}")
    dst = torch.empty(BULK, dtype=torch.uint8, device=f"cuda:{b}")
    with torch.cuda.device(a):
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(a)
        best = 0.0
        for _ in range(3):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            stop.record()
            stop.synchronize()
            best = max(best, BULK / (start.elapsed_time(stop) / 1e3) / 1e9)
    del src, dst
    return best


pairs = []
for a in range(count):
    for b in range(count):
        if a != b:
            gbps = timed(a, lambda: bufs[a].to(f"cuda:{b}", non_blocking=True))
            pairs.append({"src": a, "dst": b, "gbps": round(gbps, 2), "bulk_gbps": round(bulk(a, b), 2),
                          "peer_access": torch.cuda.can_device_access_peer(a, b)})
host = []
for g in range(count):
    pinned = torch.ones(n, dtype=torch.uint8, pin_memory=True)
    h2d = timed(g, lambda: outs[g].copy_(pinned, non_blocking=True))
    d2h = timed(g, lambda: pinned.copy_(bufs[g], non_blocking=True))
    host.append({"gpu": g, "h2d_gbps": round(h2d, 2), "d2h_gbps": round(d2h, 2)})
print(json.dumps({"tool": f"torch {torch.__version__}", "buffer_bytes": n, "init_seconds": round(init, 3),
                  "seconds": round(time.perf_counter() - t0, 3), "pairs": pairs, "host": host}))
