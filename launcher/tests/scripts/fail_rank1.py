"""A 2-rank gloo job as a new user first runs one, in a terminal (terminal_e2e): rank 1
draws a tqdm progress bar on its stderr, says whether that stderr is a terminal, then
raises ValueError at line 10 while rank 0 waits for it in a barrier."""
import os, sys, time
import torch.distributed as dist
from tqdm import tqdm
dist.init_process_group("gloo")
def check(batch):
    if dist.get_rank() == 1 and batch == 3:
        raise ValueError(f"bad batch shape on rank 1 (batch {batch})")
if dist.get_rank() == 1:
    print(f"stderr is a terminal: {sys.stderr.isatty()}", file=sys.stderr, flush=True)
    for batch in tqdm(range(5), desc="train", ncols=60, mininterval=0):
        time.sleep(0.2)
        check(batch)
dist.barrier()
