"""An ordinary FP32 torch script (knows nothing about ampsafe) whose backward goes non-finite at one step while
its loss stays finite: sqrt at 0 (its value 0, its gradient inf, times the zero weight gives NaN)."""

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--bad-step", type=int, default=2)
args = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(4):
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    out = model(x)
    loss = torch.nn.functional.mse_loss(out, y)
    if step == args.bad_step:
        loss = loss + torch.sqrt(out * 0).sum()  # finite (+0), its gradient NaN
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("script: done", flush=True)
