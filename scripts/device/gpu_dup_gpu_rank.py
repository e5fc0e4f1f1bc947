"""Every rank on GPU 0, as a job spec that forgot torch.cuda.set_device(LOCAL_RANK):
NCCL refuses the communicator (invalid usage, "Duplicate GPU detected") at the first
collective (scripts/device/gpu_first_cause_pass2.sh)."""
import torch
import torch.distributed as dist

torch.cuda.set_device(0)
dist.init_process_group("nccl")
t = torch.ones(1 << 20, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
print("all_reduce done", t[0].item())
dist.destroy_process_group()
