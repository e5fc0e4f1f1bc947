"""Ranks for the root-cause tests (no torch.distributed: each rank alone). MODE=oom:
rank 1 allocates until the memory cgroup's limit kills it. sleep: every rank sleeps
(the test kills one). raise: rank 1 raises ValueError without @record. shm: rank 0
runs a DataLoader with 2 workers whose 8 MiB samples cannot fit a small /dev/shm.
abort: rank 1 aborts after 2 s (as a rank does on a lost GPU). cudafault: rank 1
raises CUDA's illegal-address error after 2 s.
Each writes its pid to OUT/pid<rank>."""
import os
import time

rank = int(os.environ["RANK"])
with open(os.path.join(os.environ["OUT"], f"pid{rank}"), "w") as f:
    f.write(str(os.getpid()))
mode = os.environ["MODE"]


def check_batch(shape, step):
    raise ValueError(f"bad batch shape {shape} at step {step}")


if mode == "oom" and rank == 1:
    hog = []
    while True:
        hog.append(bytearray(16 << 20))
elif mode == "sleep":
    time.sleep(120)
elif mode == "raise" and rank == 1:
    check_batch((3, 224), 17)
elif mode == "abort" and rank == 1:
    time.sleep(2)
    os.abort()
elif mode == "cudafault" and rank == 1:
    time.sleep(2)
    raise RuntimeError("CUDA error: an illegal memory access was encountered")
elif mode == "shm" and rank == 0:
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Big(Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return torch.zeros(2 << 20)  # 8 MiB

    for _ in DataLoader(Big(), batch_size=1, num_workers=2):
        pass
time.sleep(1)
