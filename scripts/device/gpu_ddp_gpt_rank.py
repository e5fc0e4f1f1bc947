"""A nanoGPT-style trainer for the GPU machines (issue 61): a GPT of N_LAYER blocks
(N_EMBD wide, N_HEAD heads, BLOCK tokens), DDP, gradient accumulation over ACCUM
micro-batches of BATCH (no_sync on all but the last), bf16 autocast, AdamW, random
tokens, for SECS s. DDP's gradient buckets all_reduce while the backward still
computes: what the slow-links rule must not take for a slow link. Prints each rank's
median iteration time at the end: `iter: median 123.4 ms over N (rank R)`."""
import os
import statistics
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

env = os.environ.get
N_LAYER, N_EMBD, N_HEAD = int(env("N_LAYER", "8")), int(env("N_EMBD", "1024")), int(env("N_HEAD", "16"))
BLOCK, BATCH, ACCUM = int(env("BLOCK", "512")), int(env("BATCH", "8")), int(env("ACCUM", "4"))
VOCAB, SECS = 50304, float(env("SECS", "90"))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(N_EMBD), nn.LayerNorm(N_EMBD)
        self.attn = nn.MultiheadAttention(N_EMBD, N_HEAD, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(N_EMBD, 4 * N_EMBD), nn.GELU(), nn.Linear(4 * N_EMBD, N_EMBD))
        self.register_buffer("mask", torch.triu(torch.ones(BLOCK, BLOCK, dtype=torch.bool), 1), persistent=False)

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, N_EMBD), nn.Embedding(BLOCK, N_EMBD)
        self.blocks = nn.ModuleList(Block() for _ in range(N_LAYER))
        self.ln, self.head = nn.LayerNorm(N_EMBD), nn.Linear(N_EMBD, VOCAB, bias=False)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln(x))
        return nn.functional.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def stop_agreed(start, steps):
    """Every 10 steps, the slowest rank's elapsed time decides for all: a rank that
    stopped alone would leave the others in an all_reduce."""
    if steps % 10:
        return False
    t = torch.tensor([time.monotonic() - start], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item() >= SECS


def main():
    local = int(env("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DDP(GPT().cuda(), device_ids=[local])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    times, start, steps = [], time.monotonic(), 0
    while not stop_agreed(start, steps):
        steps += 1
        t0 = time.monotonic()
        for micro in range(ACCUM):
            x = torch.randint(0, VOCAB, (BATCH, BLOCK), device="cuda")
            sync = nullcontext() if micro == ACCUM - 1 else model.no_sync()
            with sync:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(x, x) / ACCUM
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        times.append((time.monotonic() - t0) * 1000)
    print(f"iter: median {statistics.median(times[3:]):.1f} ms over {len(times) - 3} (rank {rank})", flush=True)
    dist.destroy_process_group()


main()
