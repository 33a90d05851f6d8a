"""An ordinary FP32 torch training script (no GradScaler, knows nothing about ampsafe); one batch holds a NaN."""

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--nan-step", type=int, default=3, help="the batch whose sample --nan-sample holds a NaN")
parser.add_argument("--nan-sample", type=int, default=2)
parser.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
args = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
if args.optimizer == "adam":
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
else:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

for step in range(args.steps):
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    if step == args.nan_step:
        x[args.nan_sample, 5] = float("nan")
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
state = all(bool(torch.isfinite(t).all()) for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
print(f"script: done, parameters finite: {finite}, optimizer state finite: {state}", flush=True)
