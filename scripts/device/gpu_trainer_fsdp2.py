"""PyTorch FSDP2 (issue 61's corpus): a llama-like decoder of random weights, each
layer and the root wrapped by fully_shard (bf16 parameters, fp32 reductions), AdamW,
for SECS s: all-gathers and reduce-scatters that overlap compute. Sizes: N_LAYER, DIM,
BATCH, SEQ. FAULT (trainer_common.py) at FAULT_STEP. MESH=RxS shards over a 2-D mesh
(HSDP: parameters sharded within each of R groups of S ranks, gradients reduced across
them), so that the ranks' gathers and reductions run on two overlapping communicators."""
import os

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import trainer_common as tc
from trainer_models import LlamaStage, lm_loss

env = os.environ.get
N_LAYER, DIM, BATCH, SEQ, VOCAB = int(env("N_LAYER", "12")), int(env("DIM", "1536")), int(env("BATCH", "8")), int(env("SEQ", "1024")), 32000


def main():
    tc.init()
    torch.manual_seed(0)
    model = LlamaStage(DIM, DIM // 128, DIM * 8 // 3 // 64 * 64, VOCAB, N_LAYER).to(tc.device())
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if tc.GPU else MixedPrecisionPolicy()
    shard = {}
    if env("MESH"):
        r, s = (int(x) for x in env("MESH").split("x"))
        shard["mesh"] = init_device_mesh(tc.device().type, (r, s), mesh_dim_names=("replicate", "shard"))
    for layer in model.layers:
        fully_shard(layer, mp_policy=mp, **shard)
    fully_shard(model, mp_policy=mp, **shard)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    torch.manual_seed(tc.RANK)

    def step():
        x = torch.randint(0, VOCAB, (BATCH, SEQ + 1), device=tc.device())
        lm_loss(model(x[:, :-1]), x[:, 1:]).backward()

    tc.train("fsdp2", opt, step)
    torch.distributed.destroy_process_group()


main()
