"""An ordinary Lightning script (knows nothing about ampsafe): a tiny LightningModule on synthetic data.

The model, data and optimizer are ``growth.py``'s: under ``precision="16-mixed"`` the training itself drives
``net.head`` past float16's 65504 at step 4. ``--runs``: comma-separated ``PRECISION:OPTIMIZATION[:NAN_STEP]``, one
fresh model and ``Trainer`` each (``32:manual:2``: ``precision="32"``, manual optimization, a NaN in the batch of
step 2). Prints what each run ended with:
parameters and buffers finite, the forward's dtype, the precision plugin, its scaler class and scale.
"""

from __future__ import annotations

import argparse
import warnings

import growth  # beside this script
import lightning as L
import torch
from lightning_model import Regressor
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--runs", default="32:automatic", help="PRECISION:OPTIMIZATION[:NAN_STEP],...")
parser.add_argument("--steps", type=int, default=6)
args = parser.parse_args()
warnings.filterwarnings("ignore")


def train(precision: str, optimization: str, nan_step: int = -1) -> None:
    torch.manual_seed(0)
    model = Regressor(optimization == "manual")
    x, y = growth.data(args.steps, nan_step)
    loader = DataLoader(TensorDataset(x, y), batch_size=growth.BATCH, shuffle=False)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        precision=precision,
        max_steps=args.steps,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader)
    params = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    buffers = all(bool(torch.isfinite(b).all()) for b in model.buffers() if b.is_floating_point())
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    scale = scaler.get_scale() if scaler is not None else None
    print(
        f"script: done ({precision}, {optimization}), parameters finite: {params}, buffers finite: {buffers}, "
        f"forward dtype: {','.join(sorted(model.dtypes))}, precision plugin: {type(trainer.precision_plugin).__name__}"
        f"({getattr(trainer.precision_plugin, 'device', '-')}), scaler: "
        f"{type(scaler).__module__ + '.' + type(scaler).__name__ if scaler is not None else None}, scale: {scale}",
        flush=True,
    )


for run in args.runs.split(","):
    precision, optimization, *nan_step = run.split(":")
    train(precision, optimization, *map(int, nan_step))
