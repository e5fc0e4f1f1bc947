"""torch.distributed.pipelining (issue 61's corpus): a llama-like decoder of random
weights split into one stage per rank (the embedding on the first, the head and loss
on the last), run by ScheduleGPipe over MICRO micro-batches: activations and gradients
sent and received between neighbours, ranks that post different collectives by design.
AdamW per stage, for SECS s. Sizes: N_LAYER (per stage), DIM, BATCH, SEQ. FAULT
(trainer_common.py) at FAULT_STEP."""
import os

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

import trainer_common as tc
from trainer_models import LlamaStage, lm_loss

env = os.environ.get
N_LAYER, DIM, BATCH, SEQ = int(env("N_LAYER", "4")), int(env("DIM", "2048")), int(env("BATCH", "16")), int(env("SEQ", "1024"))
MICRO, VOCAB = int(env("MICRO", "4")), 32000


def main():
    tc.init()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    first, last = rank == 0, rank == world - 1
    stage_mod = LlamaStage(DIM, DIM // 128, DIM * 8 // 3 // 64 * 64, VOCAB, N_LAYER, first, last).to(tc.device())
    if tc.GPU:
        stage_mod = stage_mod.to(torch.bfloat16)
    stage = PipelineStage(stage_mod, rank, world, tc.device())
    schedule = ScheduleGPipe(stage, MICRO, loss_fn=lm_loss)
    opt = torch.optim.AdamW(stage_mod.parameters(), lr=3e-4)

    def step():
        x = torch.randint(0, VOCAB, (BATCH, SEQ + 1), device=tc.device(), generator=None)
        if first:
            schedule.step(x[:, :-1].contiguous())
        elif last:
            schedule.step(target=x[:, 1:].contiguous())
        else:
            schedule.step()

    tc.train("pipeline", opt, step)
    dist.destroy_process_group()


main()
