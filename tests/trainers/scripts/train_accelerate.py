"""An ordinary accelerate script (knows nothing about ampsafe): ``Accelerator(mixed_precision=...)`` on a CPU.

``--overflow`` scales the first Linear's weight so that its output passes float16's 65504 (a forward overflow
under fp16 autocast); ``--nan-step K`` puts a NaN in the batch of step K. Prints parameters finite, the dtype
the prepared model's first Linear computed in, the accelerator's scaler and its scale.
"""

from __future__ import annotations

import argparse
import warnings

import torch
from accelerate import Accelerator
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--mixed-precision", default="no")
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--nan-step", type=int, default=-1)
parser.add_argument("--overflow", action="store_true")
args = parser.parse_args()
warnings.filterwarnings("ignore")

torch.manual_seed(0)
model = nn.Sequential()
model.add_module("embed", nn.Linear(16, 64))
model.add_module("norm", nn.LayerNorm(64))
model.add_module("head", nn.Linear(64, 1))
if args.overflow:
    with torch.no_grad():
        model.embed.weight.mul_(3e5)  # |output| ~ 1e5: inf in float16
dtypes = set()
model.embed.register_forward_hook(lambda _m, _i, out: dtypes.add(str(out.dtype).replace("torch.", "")))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
accelerator = Accelerator(mixed_precision=args.mixed_precision, cpu=True)
model, optimizer = accelerator.prepare(model, optimizer)
for step in range(args.steps):
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    if step == args.nan_step:
        x[3, 2] = float("nan")
    loss = nn.functional.mse_loss(model(x).float(), y)
    optimizer.zero_grad()
    accelerator.backward(loss)
    optimizer.step()
finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
scaler = accelerator.scaler
print(
    f"script: done, parameters finite: {finite}, embed dtype: {','.join(sorted(dtypes))}, scaler: "
    f"{type(scaler).__module__ + '.' + type(scaler).__name__ if scaler is not None else None}, scale: "
    f"{scaler.get_scale() if scaler is not None else None}",
    flush=True,
)
