"""An ordinary torch AMP script (CPU float16 autocast; knows nothing about ampsafe) whose unnormalized Linear
overflows float16 in the forward pass: its outputs are ~1e5 (> 65504) from the first step."""

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--init-scale", type=float, default=8.0)
args = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential()
model.add_module("embed", torch.nn.Linear(16, 64))  # unnormalized: its output feeds a LayerNorm
model.add_module("norm", torch.nn.LayerNorm(64))
model.add_module("head", torch.nn.Linear(64, 1))
with torch.no_grad():
    model.embed.weight.mul_(3e5)  # |output| ~ 3e5: inf in float16
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu", init_scale=args.init_scale)

for _step in range(args.steps):
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    loss = torch.nn.functional.mse_loss(out.float(), y)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
print(f"script: done, scale {scaler.get_scale()}, last loss {loss.item():.4f}", flush=True)
