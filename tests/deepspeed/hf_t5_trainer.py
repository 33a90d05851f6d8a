"""HF ``Trainer(deepspeed=cfg)`` on the t5 brink (ampsafe's workload, whose decoder ``wo`` output is past 65504 from
the first step), DeepSpeed ZeRO-2 on 2 gloo ranks: a script with no ampsafe in it.

    torchrun --nproc_per_node 2 hf_t5_trainer.py OUT [--steps N] [--autocast]

``fp16=True`` (DeepSpeed's classic ``"fp16"``: every parameter float16) never overflows here: HF's T5 clamps its
float16 hidden states to float16's range itself (``T5Block``), measured 0 skipped of 8 steps. ``--autocast``
(DeepSpeed's ``torch_autocast`` float16: float32 parameters and residual stream, float16 compute) overflows at
every step, as the brink does under torch autocast.

Each rank writes ``OUT/rank<r>.json``: the trainer's steps, DeepSpeed's skipped steps, the error that ended the run,
a checksum of the parameters, the islanded modules. The CPU setup (float16 gate, no shm build) is :mod:`ds_cpu`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

import ds_cpu
import torch

from ampsafe_lab.workloads import t5_brink

CONFIG = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "fp16": {"enabled": "auto", "initial_scale_power": 4, "hysteresis": 1, "min_loss_scale": 1},
    "zero_optimization": {"stage": 2},
    "steps_per_print": 10**6,
}
# --autocast: DeepSpeed's torch_autocast float16 instead (parameters float32, torch's GradScaler)
AUTOCAST = {
    **{k: v for k, v in CONFIG.items() if k != "fp16"},
    "torch_autocast": {"enabled": True, "dtype": "float16"},
}


class Batches(torch.utils.data.Dataset):
    def __init__(self, workload, first: int, n: int) -> None:
        self.items = []
        for step in range(first, first + n):
            batch = workload.batch(step)
            self.items += [{k: v[i] for k, v in batch.items()} for i in range(len(batch["input_ids"]))]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--autocast", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    os.environ.setdefault("WANDB_DISABLED", "true")
    ds_cpu.open_cpu_float16()
    from transformers import Trainer, TrainingArguments

    workload, _, first = t5_brink.brink_start(0)
    model = workload.model
    rank = int(os.environ.get("RANK", 0))
    result = {"rank": rank, "error": None}
    trainer = None
    with tempfile.TemporaryDirectory() as tmp:
        training = TrainingArguments(
            output_dir=tmp,
            max_steps=args.steps,
            per_device_train_batch_size=8,
            learning_rate=1e-4,
            lr_scheduler_type="constant",
            weight_decay=0.0,
            logging_strategy="no",
            save_strategy="no",
            report_to=[],
            fp16=not args.autocast,
            deepspeed=AUTOCAST if args.autocast else CONFIG,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        try:
            trainer = Trainer(model=model, args=training, train_dataset=Batches(workload, first, 2 * args.steps))
            trainer.train()
        except Exception as exc:  # the run's end, quoted in the json
            result["error"] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
    engine = getattr(trainer, "model_wrapped", None)
    result["trainer_steps"] = trainer.state.global_step if trainer is not None else None
    result["skipped"] = getattr(engine, "skipped_steps", None)
    result["fp16"] = bool(engine.fp16_enabled()) if hasattr(engine, "fp16_enabled") else None
    result["dtype"] = str(next(model.parameters()).dtype)
    params = [p.detach().float() for p in model.parameters()]
    result["checksum"] = float(sum(p.double().sum() for p in params))
    result["finite"] = all(bool(torch.isfinite(p).all()) for p in params)
    result["islands"] = sorted(
        n for n, m in model.named_modules() if getattr(m, "_ampsafe_protection", None) == "island"
    )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
