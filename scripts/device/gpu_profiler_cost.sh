#!/usr/bin/env bash
# Issue 49's cost, by what the plugin asks of NCCL: VARIANTS (default: none posted all
# bursts), alternating, ROUNDS rounds (default 3) on NPROC ranks (default 4):
#   none     --nccl-profiler off: no plugin (the reference)
#   posted   the plugin counts operations posted, times none (TOPORUN_NCCL_KERNEL_SAMPLING=off)
#   all      every operation's kernel channels timed (=all)
#   bursts   the plugin's default sampling
# LAUNCH_ARGS are added to every launch (e.g. --numa-binding=exclusive, so that each rank
# runs on the same cores run after run). Each run is scripts/device/gpu_profiler_cost_rank.py (the sweep's median trials a
# size, the training loops' median steps). OUT/cost-summary.txt
# gets each run's lines and the medians over rounds against the first variant.
# Usage (device): scripts/device/gpu_profiler_cost.sh TOPORUN OUT
set -uo pipefail
T=$(readlink -f "$1") OUT=$(readlink -f "$2"); mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
N=${NPROC:-4} S=$OUT/cost-summary.txt VARIANTS=${VARIANTS:-none posted all bursts}
for r in $(seq 1 "${ROUNDS:-3}"); do
  for v in $VARIANTS; do
    p=on sampling=
    case $v in none) p=off ;; posted) sampling=off ;; all) sampling=all ;; esac
    env ${sampling:+TOPORUN_NCCL_KERNEL_SAMPLING=$sampling} "$T" --standalone --nproc-per-node="$N" \
      --nccl-profiler=$p --gpu-timing=off --nccl-report=off ${LAUNCH_ARGS:-} scripts/device/gpu_profiler_cost_rank.py \
      > "$OUT/$v-$r.txt" 2> "$OUT/$v-$r.err"
    echo "round $r $v: rc $? $(grep ^train "$OUT/$v-$r.txt" | tr '\n' ' ')" >> "$S"
  done
  # A call cut short still brings back the rounds done.
  tar czf "$OUT.tgz" -C "$OUT" .
done
python3 - "$OUT" $VARIANTS <<'PY' | tee -a "$S"
import pathlib, statistics, sys
d, variants = pathlib.Path(sys.argv[1]), sys.argv[2:]
def runs(v):
    for f in sorted(d.glob(f"{v}-*.txt")):
        yield [l.split() for l in f.read_text().splitlines()]
def sweep(v):
    rs = []
    for lines in runs(v):
        rs.append({int(w[1]): float(w[2]) for w in lines if w and w[0] == "sweep"})
    sizes = sorted({s for r in rs for s in r})
    return {s: statistics.median(r[s] for r in rs if s in r) for s in sizes}
def train(v, kind):
    xs = [float(w[2]) for lines in runs(v) for w in lines if w[:2] == ["train", kind]]
    return statistics.median(xs) if xs else float("nan")
t = {v: sweep(v) for v in variants}
ref = t[variants[0]]
print("median over rounds of each run's median (sweep: us an all_reduce; train: ms a step) against " + variants[0])
print(f"{'bytes':>11} " + "".join(f"{v:>20}" for v in variants))
for s in sorted(ref):
    print(f"{s:>11} " + "".join(f"{t[v].get(s, float('nan')):9.2f} us {100 * (t[v].get(s, float('nan')) / ref[s] - 1):+6.1f}%" for v in variants))
for kind in ["train4m", "train256k"]:
    b = train(variants[0], kind)
    print(f"{kind:>11} " + "".join(f"{train(v, kind):9.3f} ms {100 * (train(v, kind) / b - 1):+6.1f}%" for v in variants))
# Each round's run against the same round's first variant (the runs closest in time).
def one(f):
    lines = [l.split() for l in f.read_text().splitlines()]
    r = {w[1]: float(w[2]) for w in lines if w and w[0] == "sweep"}
    r.update({w[1]: float(w[2]) for w in lines if w[:1] == ["train"]})
    return r
print("paired by round against " + variants[0] + ": median [min, max] of the rounds' ratios")
for v in variants[1:]:
    pairs = [(one(d / f"{variants[0]}-{r}.txt"), one(d / f"{v}-{r}.txt"))
             for r in sorted({f.stem.rsplit("-", 1)[1] for f in d.glob(f"{v}-*.txt")}, key=int)
             if (d / f"{variants[0]}-{r}.txt").exists()]
    for k in sorted({k for a, _ in pairs for k in a}, key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else k)):
        xs = sorted(100 * (b[k] / a[k] - 1) for a, b in pairs if k in a and k in b)
        if xs:
            print(f"{v:>8} {k:>11} {statistics.median(xs):+6.2f}% [{xs[0]:+.2f}, {xs[-1]:+.2f}] of {len(xs)}")
PY
