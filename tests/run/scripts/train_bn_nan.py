"""An ordinary FP32 training script with BatchNorm (knows nothing about ampsafe): one image of one batch is all
NaN. ``--framework torch|paddle``. The model's full state (parameters and buffers: running statistics,
``num_batches_tracked``) is saved just before that batch's forward and just after its optimizer step, as
``before.npz`` / ``after.npz`` in ``--out``: what a checkpoint would hold."""

import argparse
from pathlib import Path

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--framework", default="torch", choices=["torch", "paddle"])
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--nan-step", type=int, default=2)
parser.add_argument("--nan-sample", type=int, default=1)
parser.add_argument("--out", required=True)
args = parser.parse_args()
out = Path(args.out)
rng = np.random.RandomState(0)


def batch(step):
    x = rng.randn(4, 3, 16, 16).astype("float32")
    if step == args.nan_step:
        x[args.nan_sample] = np.nan
    return x, rng.randn(4, 1).astype("float32")


if args.framework == "torch":
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 1),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def state():
        return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}

    for step in range(args.steps):
        x, y = batch(step)
        if step == args.nan_step:
            np.savez(out / "before.npz", **state())
        loss = nn.functional.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == args.nan_step:
            np.savez(out / "after.npz", **state())
else:
    import paddle
    from paddle import nn

    paddle.seed(0)
    model = nn.Sequential(
        nn.Conv2D(3, 8, 3, padding=1),
        nn.BatchNorm2D(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2D(1),
        nn.Flatten(),
        nn.Linear(8, 1),
    )
    optimizer = paddle.optimizer.Momentum(learning_rate=0.1, momentum=0.9, parameters=model.parameters())

    def state():
        return {k: v.numpy().copy() for k, v in model.state_dict().items()}

    for step in range(args.steps):
        x, y = batch(step)
        if step == args.nan_step:
            np.savez(out / "before.npz", **state())
        loss = nn.functional.mse_loss(model(paddle.to_tensor(x)), paddle.to_tensor(y))
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        if step == args.nan_step:
            np.savez(out / "after.npz", **state())
print("script: done", flush=True)
