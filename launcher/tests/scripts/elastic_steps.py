"""A training loop for membership tests: STEPS steps of STEP_SECS each. Each step
all-reduces, unless QUIET=1 (a phase without collectives, such as data loading: only
keep-alives notice a lost node then). Every step appends
"<time> <world> <rank> <step> <restart count> <pid>" to $PROBE_OUT/steps; the end writes
finished-<rank>-<world> with the restart count."""
import os, time
import torch, torch.distributed as dist

out = os.environ["PROBE_OUT"]
steps = int(os.environ.get("STEPS", "20"))
pause = float(os.environ.get("STEP_SECS", "0.25"))
quiet = os.environ.get("QUIET") == "1"
restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT", "")
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.ones(1)
for s in range(steps):
    if not quiet:
        dist.all_reduce(t)
    with open(f"{out}/steps", "a") as f:
        f.write(f"{time.time()} {world} {rank} {s} {restarts} {os.getpid()}\n")
    time.sleep(pause)
dist.barrier()
open(f"{out}/finished-{rank}-{world}", "w").write(restarts)
dist.destroy_process_group()
