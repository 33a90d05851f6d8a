"""An ordinary accelerate script (knows nothing about ampsafe): ``Accelerator(mixed_precision=...)`` on a CPU.

The model, data and optimizer are ``growth.py``'s: under fp16 autocast the training itself drives ``head`` past
float16's 65504 at step 4. ``--nan-step K`` puts a NaN in the batch of step K; ``--seed`` seeds the model's init
and the data. Prints parameters finite, the dtype the prepared model's ``embed`` computed in, the accelerator's
scaler and its scale.
"""

from __future__ import annotations

import argparse
import warnings

import growth  # beside this script
import torch
from accelerate import Accelerator

parser = argparse.ArgumentParser()
parser.add_argument("--mixed-precision", default="no")
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--nan-step", type=int, default=-1)
parser.add_argument("--seed", type=int, default=0, help="the model's init and the data")
args = parser.parse_args()
warnings.filterwarnings("ignore")

torch.manual_seed(args.seed)
model = growth.chain()
dtypes = set()
model.embed.register_forward_hook(lambda _m, _i, out: dtypes.add(str(out.dtype).replace("torch.", "")))
optimizer = growth.optimizer(model.parameters())
accelerator = Accelerator(mixed_precision=args.mixed_precision, cpu=True)
model, optimizer = accelerator.prepare(model, optimizer)
x, y = growth.data(args.steps, args.nan_step, args.seed)
for step in range(args.steps):
    batch = slice(growth.BATCH * step, growth.BATCH * (step + 1))
    loss = growth.loss(model(x[batch]), y[batch])
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
