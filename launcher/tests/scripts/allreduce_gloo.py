"""Real PyTorch gloo all_reduce through env:// (the launcher's agent store)."""
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4) * (dist.get_rank() + 1)
dist.all_reduce(t)
n = dist.get_world_size()
assert t[0].item() == n * (n + 1) / 2, t
print(f"OK rank {dist.get_rank()} of {n} sum {t[0].item():.0f}", flush=True)
dist.destroy_process_group()
