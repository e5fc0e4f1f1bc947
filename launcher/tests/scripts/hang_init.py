"""Rank 1 never reaches init_process_group; rank 0 blocks in it."""
import os, time, datetime
if os.environ["RANK"] == "1":
    time.sleep(60)
else:
    import torch.distributed as dist
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
