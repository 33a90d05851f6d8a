"""A TRL ``GRPOTrainer`` script that knows nothing about ampsafe: a CPU-size random-init causal LM (``tiny_lm.py``),
a tiny reward function (completions near 8 characters long score best), generation on the CPU with the
trained model itself (no vLLM), ``fp16=True``, a log every step, the Trainer's state (its ``log_history``) saved
to ``OUT/trainer_state.json`` at the end. Runs alone or under ``torch.distributed.run`` (DDP, gloo on the CPU)."""

from __future__ import annotations

import argparse
import os
import warnings

import tiny_lm
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

parser = argparse.ArgumentParser()
parser.add_argument("--model", choices=tiny_lm.MODELS, default="qwen3")
parser.add_argument("--init-range", type=float, default=0.02)
parser.add_argument("--hidden", type=int, default=64)
parser.add_argument("--experts", choices=("grouped_mm", "eager"), default=None)  # an MoE's experts_implementation
parser.add_argument("--lr", type=float, default=1e-6)  # GRPOConfig's own default
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--out", required=True)
args = parser.parse_args()
warnings.filterwarnings("ignore")
os.environ.setdefault("WANDB_DISABLED", "true")


def reward_length(completions, **kwargs):
    return [-abs(8 - len(text)) / 8 for text in completions]


prompts = [f"{a}+{b}=" for a in range(10) for b in range(10)]
model = tiny_lm.model(args.model, init_range=args.init_range, hidden=args.hidden, experts=args.experts)
config = GRPOConfig(
    output_dir=args.out,
    max_steps=args.steps,
    per_device_train_batch_size=4,
    num_generations=4,
    max_completion_length=12,
    learning_rate=args.lr,
    lr_scheduler_type="constant",
    beta=0.0,
    logging_steps=1,
    save_strategy="no",
    report_to=[],
    use_cpu=True,
    fp16=True,
    disable_tqdm=True,
    dataloader_num_workers=0,
    seed=0,
)
trainer = GRPOTrainer(
    model=model,
    reward_funcs=reward_length,
    args=config,
    train_dataset=Dataset.from_dict({"prompt": prompts}),
    processing_class=tiny_lm.tokenizer(),
)
trainer.train()
trainer.save_state()
wrapped = type(trainer.model_wrapped).__name__
distributed = trainer.accelerator.distributed_type
print(f"script: trained {trainer.state.global_step} steps ({distributed}, {wrapped})", flush=True)
