"""An ordinary Lightning script (knows nothing about ampsafe): a tiny LightningModule on synthetic data.

``--nan-step K`` puts a NaN in the batch of step K; ``--overflow`` scales the first Linear's weight so that
its output passes float16's 65504 (a forward overflow under ``precision="16-mixed"``); ``--optimization``:
automatic, manual, or both (``automatic,manual``: one fresh model each way). Prints what each run ended with:
parameters and buffers finite, the forward's dtype, the precision plugin, its scaler class and scale.
"""

from __future__ import annotations

import argparse
import warnings

import lightning as L
import torch
from lightning_model import Regressor  # beside this script
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--precision", default="32")
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--nan-step", type=int, default=-1)
parser.add_argument("--overflow", action="store_true")
parser.add_argument("--optimization", default="automatic", help="automatic, manual or both (comma-separated)")
args = parser.parse_args()
warnings.filterwarnings("ignore")


def train(optimization: str) -> None:
    torch.manual_seed(0)
    model = Regressor(optimization == "manual")
    if args.overflow:
        with torch.no_grad():
            model.net.embed.weight.mul_(3e5)  # |output| ~ 1e5: inf in float16
    x, y = torch.randn(8 * args.steps, 16), torch.randn(8 * args.steps, 1)
    if args.nan_step >= 0:
        x[8 * args.nan_step + 3, 2] = float("nan")
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=False)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        precision=args.precision,
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
        f"script: done ({optimization}), parameters finite: {params}, buffers finite: {buffers}, forward dtype: "
        f"{','.join(sorted(model.dtypes))}, precision plugin: {type(trainer.precision_plugin).__name__}"
        f"({getattr(trainer.precision_plugin, 'device', '-')}), scaler: "
        f"{type(scaler).__module__ + '.' + type(scaler).__name__ if scaler is not None else None}, scale: {scale}",
        flush=True,
    )


for optimization in args.optimization.split(","):
    train(optimization)
