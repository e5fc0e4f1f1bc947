"""Hugging Face Transformers' Trainer (issue 61's corpus): a GPT-2 of random weights
(N_LAYER layers, N_EMBD wide) trained as a user launches it under torchrun: DDP through
accelerate, bf16, a DataLoader with 2 workers per rank, and an evaluation on every rank
each EVAL_EVERY steps, for SECS s. FAULT (trainer_common.py) at FAULT_STEP."""
import os
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

import trainer_common as tc

env = os.environ.get
N_LAYER, N_EMBD, BATCH, BLOCK = int(env("N_LAYER", "8")), int(env("N_EMBD", "1024")), int(env("BATCH", "16")), int(env("BLOCK", "512"))
EVAL_EVERY, VOCAB = int(env("EVAL_EVERY", "200")), 32000


class Tokens(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        ids = torch.randint(0, VOCAB, (BLOCK,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


class Steps(TrainerCallback):
    def __init__(self):
        self.clock, self.faults = tc.Clock(), None

    def on_train_begin(self, args, state, control, **kw):
        self.faults = tc.Faults()

    def on_step_begin(self, args, state, control, **kw):
        self.clock.begin()

    def on_step_end(self, args, state, control, **kw):
        self.clock.end()
        self.faults.at(state.global_step)
        if self.clock.up(state.global_step):
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kw):
        self.clock.report("transformers")


def main():
    tc.before_init()
    model = GPT2LMHeadModel(GPT2Config(n_layer=N_LAYER, n_embd=N_EMBD, n_head=N_EMBD // 64, n_positions=BLOCK, vocab_size=VOCAB))
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-"), per_device_train_batch_size=BATCH, per_device_eval_batch_size=BATCH,
        max_steps=1_000_000, learning_rate=3e-4, bf16=tc.GPU, use_cpu=not tc.GPU, eval_strategy="steps", eval_steps=EVAL_EVERY,
        logging_steps=50, save_strategy="no", report_to="none", dataloader_num_workers=2, ddp_find_unused_parameters=False,
    )
    Trainer(model=model, args=args, train_dataset=Tokens(1 << 20), eval_dataset=Tokens(BATCH * 8 * int(env("WORLD_SIZE", "1"))), callbacks=[Steps()]).train()


main()
