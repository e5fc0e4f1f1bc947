#!/usr/bin/env bash
# Runs on a GPU machine: the portable release binary (glibc 2.17) with real NVML and
# NCCL. Preflight as a gate on a fit host, a NCCL all_reduce on every GPU with the live
# NCCL report and the status endpoint polled during the job, and the termination
# message of a failing rank.
# Usage: bash scripts/device/gpu_release_check.sh path/to/toporun OUTDIR
set -u
T=$(readlink -f "$1"); OUT=$2; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
B=examples/allreduce_bench.py
"$T" --version | tee "$OUT/version.txt"
ldd --version | head -1 | tee -a "$OUT/version.txt"
"$T" preflight > "$OUT/preflight.txt"; echo "preflight rc=$?" | tee -a "$OUT/preflight.txt"
# The gate on a fit host starts the ranks; the endpoint answers while they run.
PORT=18080
( TOPORUN_PREFLIGHT=gate timeout 300 "$T" --standalone --nproc-per-node=gpu \
    --status-port $PORT $B > "$OUT/job.txt" 2>&1; echo "job rc=$?" >> "$OUT/job.txt" ) &
JOB=$!
for i in $(seq 1 120); do
  python3 - "$PORT" >> "$OUT/status-poll.txt" 2>/dev/null <<'PY' && break
import sys, json, urllib.request as u
p = sys.argv[1]
ready = u.urlopen(f"http://127.0.0.1:{p}/readyz", timeout=2).status
st = json.load(u.urlopen(f"http://127.0.0.1:{p}/status", timeout=2))
m = u.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=2).read().decode()
print("readyz", ready, "ranks", [(r["local_rank"], r["state"]) for r in st["ranks"]])
print("\n".join(l for l in m.splitlines() if l.startswith(("toporun_ready", "toporun_ranks", "toporun_preflight"))))
PY
  sleep 0.5
done
wait $JOB
grep -E "RESULT|nccl|error|rc=" "$OUT/job.txt" | head -20
cat "$OUT/status-poll.txt" | tail -8
# A failing rank: its root cause goes to the termination message.
python3 -c "open('/tmp/fail.py','w').write('import sys; sys.exit(5)\n')"
"$T" --standalone --nproc-per-node=2 --termination-log "$OUT/termination-log" /tmp/fail.py > /dev/null 2>&1
echo "failing job rc=$? termination message: $(wc -c < "$OUT/termination-log") bytes" | tee "$OUT/fail.txt"
grep -E "exitcode|Root" "$OUT/termination-log" | tee -a "$OUT/fail.txt"
