"""A plain torch training loop that knows nothing about ampsafe: ``torch.amp.GradScaler`` and CPU float16 autocast.

The scaler starts at 2**40, where the first float16 gradients overflow: the first steps are skipped and backed
off, then the loop trains clean, so every ``amp/*`` series changes over the run. ``--steps``: optimizer steps.
"""

from __future__ import annotations

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
args = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40, backoff_factor=2.0**-8)
for _ in range(args.steps):
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(torch.randn(8, 16)).float().pow(2).mean()
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
print(f"script: {args.steps} steps, scale {scaler.get_scale()}")
