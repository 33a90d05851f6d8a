"""An ordinary torch AMP script written for a GPU (torch.amp.GradScaler("cuda")), run on a CPU: the scaler is
disabled and the run is FP32. Knows nothing about ampsafe; --nan-step puts a NaN in one batch."""

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--nan-step", type=int, default=-1)
args = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cuda")
for step in range(args.steps):
    x = torch.randn(8, 16)
    if step == args.nan_step:
        x[0, 0] = float("nan")
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
print(f"script: done, scaler enabled {scaler.is_enabled()}, parameters finite: {finite}", flush=True)
