"""A TRL ``SFTTrainer`` script that knows nothing about ampsafe: a CPU-size random-init causal LM
(``tiny_lm.py``: Qwen3, Gemma3 or Qwen3-MoE from transformers' own classes), ``fp16=True``, a log every step, the
Trainer's state (its ``log_history``) saved to ``OUT/trainer_state.json`` at the end, as ``trainer.save_state()``
does. Runs alone or under ``torch.distributed.run`` (DDP, gloo on the CPU)."""

from __future__ import annotations

import argparse
import os
import warnings

import tiny_lm
from datasets import Dataset
from trl import SFTConfig, SFTTrainer

parser = argparse.ArgumentParser()
parser.add_argument("--model", choices=tiny_lm.MODELS, default="qwen3")
parser.add_argument("--init-range", type=float, default=0.02)
parser.add_argument("--hidden", type=int, default=64)
parser.add_argument("--experts", choices=("grouped_mm", "eager"), default=None)  # an MoE's experts_implementation
parser.add_argument("--lr", type=float, default=2e-5)  # SFTConfig's own default
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--batch", type=int, default=4)
parser.add_argument("--out", required=True)
args = parser.parse_args()
warnings.filterwarnings("ignore")
os.environ.setdefault("WANDB_DISABLED", "true")

WORDS = "the cat sat on a mat and ate two red figs while one dog ran by the old oak tree".split()


def text(i: int) -> str:
    a, b = (i * 7) % 50, (i * 13) % 50
    return f"{a}+{b}={a + b}. " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(4))


dataset = Dataset.from_dict({"text": [text(i) for i in range(args.batch * args.steps * 2)]})
model = tiny_lm.model(args.model, init_range=args.init_range, hidden=args.hidden, experts=args.experts)
config = SFTConfig(**tiny_lm.sft_options(out=args.out, steps=args.steps, batch=args.batch, lr=args.lr, fp16=True))
trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tiny_lm.tokenizer())
trainer.train()
trainer.save_state()
wrapped = type(trainer.model_wrapped).__name__
distributed = trainer.accelerator.distributed_type
print(f"script: trained {trainer.state.global_step} steps ({distributed}, {wrapped})", flush=True)
