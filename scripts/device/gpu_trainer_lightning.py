"""PyTorch Lightning (issue 61's corpus): Trainer(strategy="ddp") on a GPT of random
weights, as a user launches it under torchrun: Lightning reads torchrun's variables
(TorchElasticEnvironment) and makes the process group itself. A DataLoader of random
tokens with 2 workers per rank, bf16-mixed, for SECS s. FAULT (trainer_common.py) at
FAULT_STEP. Sizes: N_LAYER, N_EMBD, BATCH, BLOCK."""
import os

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset

import trainer_common as tc
from trainer_models import Gpt, lm_loss

env = os.environ.get
N_LAYER, N_EMBD, BATCH, BLOCK, VOCAB = int(env("N_LAYER", "8")), int(env("N_EMBD", "1024")), int(env("BATCH", "16")), int(env("BLOCK", "512")), 32000


class Tokens(Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        return torch.randint(0, VOCAB, (BLOCK + 1,), generator=torch.Generator().manual_seed(i))


class Lm(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.gpt = Gpt(N_LAYER, N_EMBD, N_EMBD // 64, BLOCK, VOCAB)
        self.clock, self.faults = tc.Clock(), None

    def training_step(self, batch, i):
        loss = lm_loss(self.gpt(batch[:, :-1]), batch[:, 1:])
        self.log("loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-4)

    def on_fit_start(self):
        self.faults = tc.Faults()

    def on_train_batch_start(self, batch, i):
        self.clock.begin()

    def on_train_batch_end(self, out, batch, i):
        self.clock.end()
        self.faults.at(i)
        if self.clock.up(i):
            self.trainer.should_stop = True

    def on_fit_end(self):
        self.clock.report("lightning")


def main():
    tc.before_init()
    world, nodes = int(env("LOCAL_WORLD_SIZE", "1")), int(env("WORLD_SIZE", "1")) // int(env("LOCAL_WORLD_SIZE", "1"))
    trainer = pl.Trainer(
        accelerator="gpu" if tc.GPU else "cpu", devices=world, num_nodes=nodes, strategy="ddp",
        precision="bf16-mixed" if tc.GPU else "32-true", max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    loader = DataLoader(Tokens(), batch_size=BATCH, num_workers=2, persistent_workers=True)
    trainer.fit(Lm(), loader)


main()
