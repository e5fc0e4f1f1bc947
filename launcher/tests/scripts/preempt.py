"""A rank of the preemption tests (gloo; a DataLoader with 2 workers). MODE=handler:
a SIGTERM handler sets a flag; file: no handler, the loop polls TOPORUN_STOP_FILE.
Either way the flag is all-reduced (MAX) at every step, so every rank stops at the
same step, saves one torch.distributed.checkpoint together (its own tensor, key
r<rank>) into CKPT, then reads 2 more batches (its workers must still serve it) and
says so. Writes OUT/ready<rank> once it runs its loop."""
import os
import sys
import signal
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

mode = os.environ["MODE"]
dist.init_process_group("gloo")
rank = dist.get_rank()
told = False


def on_term(sig, frame):
    global told
    told = True


if mode == "handler":
    signal.signal(signal.SIGTERM, on_term)


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        return torch.full((4,), float(i))


batches = iter(torch.utils.data.DataLoader(Data(), batch_size=1, num_workers=2))
step = 0
while True:
    x = next(batches)[0]
    dist.all_reduce(x)
    if step == 2:
        open(os.path.join(os.environ["OUT"], f"ready{rank}"), "w").write(str(os.getpid()))
    here = told if mode == "handler" else os.path.exists(os.environ["TOPORUN_STOP_FILE"])
    flag = torch.tensor([1.0 if here else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item() > 0:
        break
    step += 1
    time.sleep(0.1)
dcp.save({f"r{rank}": torch.full((8,), float(rank))}, checkpoint_id=os.environ["CKPT"])
extra = [next(batches) for _ in range(2)]
# One write per line: under python -u, print() writes the text and its newline in two,
# and four ranks saying this at once interleaved them ("...after the stoprank 1 ...").
sys.stdout.write(f"rank {rank} saved at step {step}; read {len(extra)} batches after the stop\n")
sys.stdout.flush()
