"""A float16 training loop with no loss scaler (knows nothing about ampsafe): CPU float16 autocast,
``loss.backward()`` and ``optimizer.step()``, as NeMo-RL's DTensor float16 path runs. The loss is a weighted
term (``--loss-weight``) whose gradients sit near float16's subnormal range at scale 1. Writes its losses as
JSON to ``--out``."""

import argparse
import json

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--loss-weight", type=float, default=1e-4)
parser.add_argument("--out", default="losses.json")
args = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 128), torch.nn.GELU(), torch.nn.Linear(128, 8)
)
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
teacher = torch.nn.Linear(32, 8)

losses = []
for _step in range(args.steps):
    x = torch.randn(128, 32)
    with torch.no_grad():
        target = teacher(x)
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    loss = args.loss_weight * torch.nn.functional.mse_loss(out.float(), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())

with open(args.out, "w") as fh:
    json.dump({"losses": losses}, fh)
print(f"script: done, loss {losses[0]:.4g} -> {losses[-1]:.4g}", flush=True)
