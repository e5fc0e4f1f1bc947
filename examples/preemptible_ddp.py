"""A DDP loop that survives preemption: when any node is told to go (SIGTERM from a
drain or a spot reclaim), toporun makes $TOPORUN_STOP_FILE on every node; each rank
checks it at every step, the ranks agree (all_reduce MAX), and all of them save one
torch.distributed.checkpoint together, then exit 0. The next job resumes from it.

    toporun --standalone --nproc-per-node=2 --stop-grace=60 examples/preemptible_ddp.py
    # then: kill -TERM <toporun's pid>   (or kubectl drain / a spot reclaim)
"""
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP

CKPT = os.environ.get("CKPT", "/tmp/preemptible_ddp_ckpt")


def stop_requested():
    """True on every rank once any node was asked to stop (the 10-line pattern)."""
    here = os.path.exists(os.environ.get("TOPORUN_STOP_FILE", "/nonexistent"))
    flag = torch.tensor([1.0 if here else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() > 0


def main():
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = 0
    if os.path.exists(os.path.join(CKPT, ".metadata")):
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd, "step": torch.tensor(0)}
        dcp.load(state, checkpoint_id=CKPT)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        step = int(state["step"])
        if dist.get_rank() == 0:
            print(f"resumed at step {step} from {CKPT}", flush=True)
    while step < 100_000:
        loss = model(torch.randn(32, 64)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if stop_requested():
            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optim": osd, "step": torch.tensor(step)}, checkpoint_id=CKPT)
            if dist.get_rank() == 0:
                print(f"stopped at step {step}: checkpoint in {CKPT}", flush=True)
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
