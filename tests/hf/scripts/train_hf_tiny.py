"""An ordinary HF ``Trainer`` script (knows nothing about ampsafe): one tiny random-init model of tests/hf, 5 steps.

``--model bert,gpt2,t5,vit,llama`` (one Trainer after the other), ``--attn sdpa|eager``, ``--fp16`` for ``TrainingArguments(fp16=True)``.
``--overflow MODULE``: that module's weight scaled so that its float32 output on the first batch reaches twice 65504
(a real float16 overflow of that layer, as T5's ``wo`` had in HF issue #5651).
Prints whether every parameter is finite and the optimizer steps the trainer counted.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from transformers import Trainer, TrainingArguments

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hf_models import batch, build, scale_past_float16  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="t5")
parser.add_argument("--attn", default="sdpa")
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--fp16", action="store_true")
parser.add_argument("--overflow", default="", help="module path whose weight is scaled past float16's range")
args = parser.parse_args()
warnings.filterwarnings("ignore")
os.environ.setdefault("WANDB_DISABLED", "true")


class Batches(torch.utils.data.Dataset):
    """Sample i of synthetic batch i // 2 (padding masks included), as the tests' own batches."""

    def __init__(self, name: str, n: int) -> None:
        self.samples = [{k: v[i % 2] for k, v in batch(name, seed=i // 2).items()} for i in range(n)]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


for name in args.model.split(","):
    model = build(name, args.attn)
    if args.overflow:
        scale_past_float16(model, args.overflow, batch(name, seed=0))
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(
            output_dir=out,
            max_steps=args.steps,
            per_device_train_batch_size=2,
            learning_rate=1e-3,
            logging_strategy="no",
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            fp16=args.fp16,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = Trainer(model=model, args=training, train_dataset=Batches(name, 2 * args.steps))
        trainer.train()
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    print(f"script: {name} done, parameters finite: {finite}, trainer steps: {trainer.state.global_step}", flush=True)
