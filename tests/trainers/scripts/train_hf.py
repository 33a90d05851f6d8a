"""An ordinary HF ``Trainer`` script (knows nothing about ampsafe): a tiny random-init GPT-2 on synthetic tokens.

``--runs``: comma-separated ``PRECISION:LR:STEPS[:NAN_STEP]``, one fresh model and ``Trainer`` each (AdamW at a
constant lr, no weight decay, no dropout). ``fp16`` asks for ``TrainingArguments(fp16=True)``; ``NAN_STEP`` makes
the loss of that step NaN (a ``compute_loss`` override, as a custom loss would). At lr 2 (a diverging run) the
model's own training drives ``c_proj`` outputs of its blocks past float16's 65504 within about 5 steps (float32:
1.3e5-2.2e5 at step 4-5, seeds 0-1). Prints, per run, whether every parameter is finite, the optimizer steps the
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
parser.add_argument("--runs", default="fp32:1e-3:8", help="PRECISION:LR:STEPS[:NAN_STEP],...")
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
    nan_step = -1

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.state.global_step == self.nan_step:
            loss = loss * float("nan")
        return loss


def train(precision: str, lr: float, steps: int, nan_step: int = -1) -> None:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    model = GPT2LMHeadModel(config)
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(
            output_dir=out,
            max_steps=steps,
            per_device_train_batch_size=4,
            learning_rate=lr,
            lr_scheduler_type="constant",
            weight_decay=0.0,
            logging_strategy="no",
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            fp16=precision == "fp16",
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = NanTrainer(model=model, args=training, train_dataset=Tokens(4 * steps))
        trainer.nan_step = nan_step
        trainer.train()
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    scaler = trainer.accelerator.scaler
    print(
        f"script: done ({precision}), parameters finite: {finite}, trainer steps: {trainer.state.global_step}, scaler: "
        f"{type(scaler).__name__ if scaler is not None else None}",
        flush=True,
    )


for run in args.runs.split(","):
    precision, lr, steps, *nan_step = run.split(":")
    train(precision, float(lr), int(steps), *map(int, nan_step))
