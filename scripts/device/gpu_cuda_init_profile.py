"""Where `preflight --measure`'s CUDA start-up goes (issue 52), from the driver API
itself (ctypes, no PyTorch): dlopen, cuInit, then per GPU each step toporun's setup
takes (primary context, two 64 MiB buffers, a memset, 64 MiB of pinned host memory,
a stream), one GPU after another or a thread per GPU; peer access per pair.

Usage (device): python3 gpu_cuda_init_profile.py MODE   (MODE: serial | threads |
init-only | no-host | ctx-only | release-threads | no-release); prints one JSON line.
release-threads and no-release set up contexts only, then release them a thread per
GPU, or not at all (the process's exit does)."""
import ctypes, json, os, sys, threading, time

MODE = sys.argv[1] if len(sys.argv) > 1 else "serial"
MiB64 = 64 << 20
t0 = time.perf_counter()
cu = ctypes.CDLL("libcuda.so.1")
t_dlopen = time.perf_counter() - t0


def ck(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what}: CUDA error {rc}")


t = time.perf_counter()
ck(cu.cuInit(0), "cuInit")
t_init = time.perf_counter() - t
n = ctypes.c_int()
ck(cu.cuDeviceGetCount(ctypes.byref(n)), "count")
out = {"mode": MODE, "gpus": n.value, "dlopen_s": round(t_dlopen, 4), "cuinit_s": round(t_init, 4)}
if MODE == "init-only":
    print(json.dumps(out))
    sys.exit(0)

steps = {}
ctxs = {}


def setup(i):
    s = {}
    dev = ctypes.c_int()
    ck(cu.cuDeviceGet(ctypes.byref(dev), i), "get")
    ctx = ctypes.c_void_p()
    t = time.perf_counter()
    ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
    s["retain"] = time.perf_counter() - t
    t = time.perf_counter()
    ck(cu.cuCtxSetCurrent(ctx), "current")
    s["current"] = time.perf_counter() - t
    ctxs[i] = (dev, ctx)
    if MODE in ("ctx-only", "release-threads", "no-release"):
        steps[i] = s
        return
    a, b = ctypes.c_uint64(), ctypes.c_uint64()
    t = time.perf_counter()
    ck(cu.cuMemAlloc_v2(ctypes.byref(a), ctypes.c_size_t(MiB64)), "alloc")
    s["alloc1"] = time.perf_counter() - t
    t = time.perf_counter()
    ck(cu.cuMemAlloc_v2(ctypes.byref(b), ctypes.c_size_t(MiB64)), "alloc")
    s["alloc2"] = time.perf_counter() - t
    t = time.perf_counter()
    ck(cu.cuMemsetD8_v2(a, ctypes.c_ubyte(1), ctypes.c_size_t(MiB64)), "memset")
    ck(cu.cuCtxSynchronize(), "sync")
    s["memset"] = time.perf_counter() - t
    if MODE != "no-host":
        h = ctypes.c_void_p()
        t = time.perf_counter()
        ck(cu.cuMemHostAlloc(ctypes.byref(h), ctypes.c_size_t(MiB64), 0), "hostalloc")
        s["hostalloc"] = time.perf_counter() - t
        t = time.perf_counter()
        ctypes.memset(h, 1, MiB64)
        s["hosttouch"] = time.perf_counter() - t
    st = ctypes.c_void_p()
    t = time.perf_counter()
    ck(cu.cuStreamCreate(ctypes.byref(st), 1), "stream")
    s["stream"] = time.perf_counter() - t
    steps[i] = s


t = time.perf_counter()
if MODE == "threads":
    ts = [threading.Thread(target=setup, args=(i,)) for i in range(n.value)]
    [x.start() for x in ts]
    [x.join() for x in ts]
else:
    # ONLY=i: this process sets up GPU i alone (it still sees them all).
    for i in [int(os.environ["ONLY"])] if os.environ.get("ONLY") else range(n.value):
        setup(i)
out["setup_s"] = round(time.perf_counter() - t, 4)
out["steps"] = {i: {k: round(v, 4) for k, v in s.items()} for i, s in sorted(steps.items())}
peer = {}
t = time.perf_counter()
for i in ctxs:
    for j in ctxs:
        if i == j:
            continue
        ck(cu.cuCtxSetCurrent(ctxs[i][1]), "current")
        p = time.perf_counter()
        rc = cu.cuCtxEnablePeerAccess(ctxs[j][1], 0)
        peer[f"{i}->{j}"] = (round(time.perf_counter() - p, 4), rc)
out["peer_s"] = round(time.perf_counter() - t, 4)
out["peer"] = peer
t = time.perf_counter()
if MODE == "release-threads":
    ts = [threading.Thread(target=cu.cuDevicePrimaryCtxRelease_v2, args=(ctxs[i][0],)) for i in ctxs]
    [x.start() for x in ts]
    [x.join() for x in ts]
elif MODE != "no-release":
    for i in ctxs:
        ck(cu.cuDevicePrimaryCtxRelease_v2(ctxs[i][0]), "release")
out["release_s"] = round(time.perf_counter() - t, 4)
out["total_s"] = round(time.perf_counter() - t0, 4)
print(json.dumps(out))
