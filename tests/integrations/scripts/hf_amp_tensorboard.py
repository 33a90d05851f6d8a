"""HF ``Trainer`` with ``callbacks=[AmpCallback()]`` and ``report_to=["tensorboard"]``: a tiny random-init GPT-2.

Run under ``ampsafe run --emulate-fp16`` so that ``fp16=True`` trains in float16 with accelerate's own scaler
(ampsafe's) on a CPU; at lr 2 the model's own training overflows float16 within a few steps (skips, a floor hit,
a heal). A second user callback adds ``user/marker`` in its ``on_log``, the way users do, to show where such keys
end up. Prints one JSON line: the scaler's own figures after training and ``trainer.state.log_history``.
"""

from __future__ import annotations

import argparse
import json
import os
import warnings

import torch
from scaler_figures import scaler_figures
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

import ampsafe.torch
from ampsafe.integrations.hf import AmpCallback

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--lr", type=float, default=2.0)
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


class UserMarker(TrainerCallback):
    """What a user callback usually does: add a key to ``logs`` in ``on_log``."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs["user/marker"] = 1.0


torch.manual_seed(0)
config = GPT2Config(
    vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
)
training = TrainingArguments(
    output_dir=args.out,
    max_steps=args.steps,
    per_device_train_batch_size=4,
    learning_rate=args.lr,
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
trainer = Trainer(
    model=GPT2LMHeadModel(config),
    args=training,
    train_dataset=Tokens(4 * args.steps),
    callbacks=[UserMarker(), AmpCallback()],
)
trainer.train()
scaler = trainer.accelerator.scaler
figures = {
    "ampsafe_scaler": isinstance(scaler, ampsafe.torch.GradScaler),
    **scaler_figures(scaler),
    "callbacks": [type(cb).__name__ for cb in trainer.callback_handler.callbacks],
    "log_history": trainer.state.log_history,
}
print("FIGURES " + json.dumps(figures), flush=True)
