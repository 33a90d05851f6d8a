"""A tiny, ordinary torch AMP training script (knows nothing about ampsafe): used by tests/run."""

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--init-scale", type=float, default=2.0**16)
parser.add_argument("--poison", action="store_true", help="make every loss infinite (a diverged run)")
parser.add_argument("--nan-step", type=int, default=-1, help="put a NaN into this step's batch")
parser.add_argument("--cuda-namespace", action="store_true", help="use torch.cuda.amp.GradScaler (older scripts)")
args = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
if args.cuda_namespace:
    scaler = torch.cuda.amp.GradScaler(init_scale=args.init_scale, enabled=False)
else:
    scaler = torch.amp.GradScaler("cpu", init_scale=args.init_scale)
print(f"script: scaler is {type(scaler).__module__}.{type(scaler).__name__}", flush=True)

for _step in range(args.steps):
    x = torch.randn(8, 16)
    if _step == args.nan_step:
        x[4, 0] = float("nan")
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(x).float().pow(2).mean()
    if args.poison:
        loss = loss * float("inf")
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
print(f"script: done, scale {scaler.get_scale()}", flush=True)
