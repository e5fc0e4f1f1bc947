#!/usr/bin/env bash
# Where a GPU host's start-up goes (issue 40's floor: 8 no-op ranks): the same job,
# its dry run and the host probe alone, each timed 7 times; NVML's own calls timed
# from Python (init, shutdown, the per-device queries toporun makes); and one launch
# under strace -f -tt -T where strace is installed.
# Usage (device): scripts/device/gpu_startup_profile.sh TOPORUN OUT
set -uo pipefail
BIN=$(readlink -f "$1") OUT=$2
mkdir -p "$OUT"
JOB=(--standalone --nproc-per-node=8 --no-python /bin/true)
nvidia-smi -q | grep -iE "persistence mode|driver version" | sort | uniq -c > "$OUT/driver.txt"
python3 - "$BIN" "${JOB[@]}" > "$OUT/phases.txt" 2>&1 <<'PY'
import os, statistics, subprocess, sys, time
bin, job = sys.argv[1], sys.argv[2:]
cases = {
    "floor (bash, 8 /bin/true)": ["bash", "-c", "for i in 1 2 3 4 5 6 7 8; do /bin/true & done; wait"],
    "toporun --version": [bin, "--version"],
    "probe --format json (no metadata)": [bin, "probe", "--format", "json", "--no-metadata"],
    "launch --dry-run": [bin, "launch", "--dry-run", *job],
    "launch (8 no-op ranks)": [bin, *job],
    "launch, CUDA_VISIBLE_DEVICES=''": [bin, *job],
}
for name, argv in cases.items():
    env = dict(os.environ)
    if "CUDA_VISIBLE_DEVICES=''" in name:
        env["CUDA_VISIBLE_DEVICES"] = ""
    walls = []
    for _ in range(7):
        t = time.perf_counter()
        r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        walls.append(time.perf_counter() - t)
    err = r.stderr.decode(errors="replace").strip().splitlines()[-1:] if r.returncode else ""
    print(f"{name:<40} median {statistics.median(walls)*1000:8.1f} ms  min {min(walls)*1000:8.1f}  rc={r.returncode} {err}")
PY
python3 - > "$OUT/nvml.txt" 2>&1 <<'PY'
import ctypes, time
nv = ctypes.CDLL("libnvidia-ml.so.1")
def t(name, f, *a):
    s = time.perf_counter(); rc = f(*a); d = (time.perf_counter() - s) * 1000
    print(f"{name:<44} {d:8.2f} ms rc={rc}")
    return rc
t("nvmlInit_v2", nv.nvmlInit_v2)
n = ctypes.c_uint(); t("nvmlDeviceGetCount_v2", nv.nvmlDeviceGetCount_v2, ctypes.byref(n))
hs = []
for i in range(n.value):
    h = ctypes.c_void_p(); t(f"GetHandleByIndex({i})", nv.nvmlDeviceGetHandleByIndex_v2, i, ctypes.byref(h)); hs.append(h)
for i, h in enumerate(hs):
    st = ctypes.c_int()
    s = time.perf_counter()
    for link in range(18):
        nv.nvmlDeviceGetNvLinkState(h, link, ctypes.byref(st))
    print(f"18x GetNvLinkState({i})                      {(time.perf_counter()-s)*1000:8.2f} ms")
    buf = (ctypes.c_uint * 64)(); cnt = ctypes.c_uint(64)
    t(f"GetComputeRunningProcesses_v3({i})", nv.nvmlDeviceGetComputeRunningProcesses_v3, h, ctypes.byref(cnt), buf)
    mem = (ctypes.c_ulonglong * 3)(); t(f"GetMemoryInfo({i})", nv.nvmlDeviceGetMemoryInfo, h, mem)
    t(f"GetRetiredPages/RemappedRows({i})", nv.nvmlDeviceGetRemappedRows, h, ctypes.byref(ctypes.c_uint()), ctypes.byref(ctypes.c_uint()), ctypes.byref(ctypes.c_uint()), ctypes.byref(ctypes.c_uint()))
es = ctypes.c_void_p(); t("nvmlEventSetCreate", nv.nvmlEventSetCreate, ctypes.byref(es))
for i, h in enumerate(hs):
    t(f"nvmlDeviceRegisterEvents({i}, Xid)", nv.nvmlDeviceRegisterEvents, h, ctypes.c_ulonglong(0x8), es)
t("nvmlEventSetFree", nv.nvmlEventSetFree, es)
t("nvmlShutdown", nv.nvmlShutdown)
t("nvmlInit_v2 again", nv.nvmlInit_v2)
t("nvmlShutdown again", nv.nvmlShutdown)
PY
if command -v strace >/dev/null; then
  strace -f -tt -T -o "$OUT/launch.strace" "$BIN" "${JOB[@]}" > /dev/null 2>&1
  echo "strace: $(wc -l < "$OUT/launch.strace") lines" >> "$OUT/phases.txt"
else
  echo "no strace on this machine" >> "$OUT/phases.txt"
fi
cat "$OUT/driver.txt" "$OUT/phases.txt" "$OUT/nvml.txt"
