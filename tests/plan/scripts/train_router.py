"""An ordinary torch AMP script (knows nothing about ampsafe): plan_models.router_net under float16 autocast,
whose MoE router overflows float16 in the forward pass from the first step."""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from plan_models import router_batch, router_net  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
args = parser.parse_args()

model = router_net()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
for step in range(args.steps):
    x, y = router_batch(step)
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    loss = torch.nn.functional.mse_loss(out.float(), y)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
print(f"script: done, scale {scaler.get_scale()}, last loss {loss.item():.4f}", flush=True)
