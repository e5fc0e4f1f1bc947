"""Two ranks all-reduce in a loop; at step 5 rank 1 leaves the process group (its
peer sees the connection reset at once), then, 2 s later, raises: the peer's rank
fails first, and the cause is on rank 1's node."""
import time
import torch, torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1)
for s in range(100):
    if rank == 1 and s == 5:
        dist.destroy_process_group()
        time.sleep(2)
        raise ValueError(f"bad batch at step {s}")
    dist.all_reduce(t)
    time.sleep(0.1)
