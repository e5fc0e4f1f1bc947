"""Ranks for the straggler tests (gloo): a training loop of compute (a matmul
forward/backward of a small model) then an all_reduce of its gradients, for SECS.
SLOW_RANK does FACTOR times the compute; PAUSE_AT seconds in (as rank 0 sees it,
agreed through the loop's all_reduce, as a checkpoint every N steps is), every rank
saves a checkpoint for PAUSE seconds (torch.save in a loop); LOG_AT seconds in, rank 0
alone prints progress lines for LOG_SECS (as a rank 0 logging metrics does). Each step
sleeps a random 0 to 2*GPU_MS ms after its compute, as a rank's CPU waits for its GPU
with some jitter: the ranks wait for each other at random, none more than another,
and they leave CPU free, so four ranks do not fill two cores (a saturated CPU keeps
whichever rank fell behind behind for tens of seconds: a real straggler). With
DEVICE=cuda the model runs on the GPU (ranks may share one) and the gradients go
through gloo on the CPU. Each writes its pid to
OUT/pid<rank> once it is in the loop."""
import os
import random
import time

import torch
import torch.distributed as dist


def forward_backward(model, x, times):
    for _ in range(times):
        model.zero_grad()
        model(x).square().mean().backward()


def save_checkpoint(model, seconds, path):
    end = time.time() + seconds
    while time.time() < end:
        torch.save(model.state_dict(), path)


def log_progress(seconds, step):
    end = time.time() + seconds
    while time.time() < end:
        print(f"step {step}: loss 0.1234, lr 0.001, grad norm 1.0", flush=True)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    secs = float(os.environ.get("SECS", "30"))
    slow = int(os.environ.get("SLOW_RANK", "-1"))
    factor = int(os.environ.get("FACTOR", "3"))
    pause_at = float(os.environ.get("PAUSE_AT", "-1"))
    pause = float(os.environ.get("PAUSE", "10"))
    log_at = float(os.environ.get("LOG_AT", "-1"))
    log_secs = float(os.environ.get("LOG_SECS", "2"))
    gpu_secs = float(os.environ.get("GPU_MS", "0")) / 1000
    jitter = random.Random(rank)
    out = os.environ["OUT"]
    torch.manual_seed(0)
    device = os.environ.get("DEVICE", "cpu")
    width = 4096 if device == "cuda" else 256
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width)
    ).to(device)
    x = torch.randn(64 * (16 if device == "cuda" else 1), width, device=device)
    steps = int(os.environ.get("STEPS", "30"))
    with open(os.path.join(out, f"pid{rank}"), "w") as f:
        f.write(str(os.getpid()))
    start = time.time()
    paused = logged = False
    step = 0
    # Only the agreed flag ends the loop: a rank reading its own clock would leave
    # the others in their next all_reduce.
    while True:
        forward_backward(model, x, steps * (factor if rank == slow else 1))
        if gpu_secs > 0:
            time.sleep(jitter.uniform(0, 2 * gpu_secs))
        # One flat bucket, as DDP sends its gradients.
        flat = torch.cat([p.grad.flatten() for p in model.parameters()]).cpu()
        dist.all_reduce(flat)
        # Every rank stops, and pauses, at the same step.
        now = time.time() - start
        lead = rank == 0
        flags = torch.tensor(
            [float(now >= secs), float(lead and 0 <= pause_at <= now), float(lead and 0 <= log_at <= now)]
        )
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        step += 1
        if flags[1].item() > 0 and not paused:
            save_checkpoint(model, pause, os.path.join(out, f"ckpt{rank}.pt"))
            paused = True
        if flags[2].item() > 0 and not logged:
            if rank == 0:
                log_progress(log_secs, step)
                open(os.path.join(out, "logged"), "w").close()
            logged = True
        if flags[0].item() > 0:
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
