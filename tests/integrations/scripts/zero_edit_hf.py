"""An HF ``Trainer`` script that knows nothing about ampsafe: a tiny random-init GPT-2, ``fp16=True``,
``report_to=["tensorboard"]``, a log every step. Under ``ampsafe run --emulate-fp16`` its float16 training at lr 2
overflows within a few steps (skips, a floor hit, a heal). Prints the TensorBoard folder's path."""

from __future__ import annotations

import argparse
import os
import warnings

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=12)
args = parser.parse_args()
warnings.filterwarnings("ignore")
os.environ.setdefault("WANDB_DISABLED", "true")


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 64, (n, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


torch.manual_seed(0)
config = GPT2Config(
    vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
)
training = TrainingArguments(
    output_dir=args.out,
    max_steps=args.steps,
    per_device_train_batch_size=4,
    learning_rate=2.0,
    lr_scheduler_type="constant",
    weight_decay=0.0,
    logging_steps=1,
    save_strategy="no",
    report_to=["tensorboard"],
    use_cpu=True,
    fp16=True,
    disable_tqdm=True,
    dataloader_num_workers=0,
)
trainer = Trainer(model=GPT2LMHeadModel(config), args=training, train_dataset=Tokens(4 * args.steps))
trainer.train()
print(f"script: trained {trainer.state.global_step} steps", flush=True)
