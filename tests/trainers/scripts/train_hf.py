"""An ordinary HF ``Trainer`` script (knows nothing about ampsafe): a tiny random-init GPT-2 on synthetic tokens.

``--nan-step K`` makes the loss of step K NaN (a ``compute_loss`` override, as a custom loss would); ``--fp16``
asks for ``TrainingArguments(fp16=True)``. Prints whether every parameter is finite, the optimizer steps the
trainer counted and the accelerator's scaler.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import warnings

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--nan-step", type=int, default=-1)
parser.add_argument("--fp16", action="store_true")
args = parser.parse_args()
warnings.filterwarnings("ignore")
os.environ.setdefault("WANDB_DISABLED", "true")


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 64, (n, 16), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class NanTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.state.global_step == args.nan_step:
            loss = loss * float("nan")
        return loss


torch.manual_seed(0)
config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2)
model = GPT2LMHeadModel(config)
with tempfile.TemporaryDirectory() as out:
    training = TrainingArguments(
        output_dir=out,
        max_steps=args.steps,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_strategy="no",
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        fp16=args.fp16,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = NanTrainer(model=model, args=training, train_dataset=Tokens(4 * args.steps))
    trainer.train()
finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
scaler = trainer.accelerator.scaler
print(
    f"script: done, parameters finite: {finite}, trainer steps: {trainer.state.global_step}, scaler: "
    f"{type(scaler).__name__ if scaler is not None else None}",
    flush=True,
)
