"""An FP32 Paddle training script that raises on a non-finite loss (no ``sys.exit``: the error ends it, as
ppdet's and many users' loops do), before any optimizer step of that batch; one batch holds a NaN."""

import argparse

import numpy as np
import paddle

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--nan-step", type=int, default=2)
args = parser.parse_args()

paddle.seed(0)
model = paddle.nn.Sequential(paddle.nn.Linear(16, 32), paddle.nn.Tanh(), paddle.nn.Linear(32, 1))
optimizer = paddle.optimizer.Adam(learning_rate=1e-2, parameters=model.parameters())
for step in range(args.steps):
    x = np.random.RandomState(step).randn(8, 16).astype("float32")
    if step == args.nan_step:
        x[3, 2] = np.nan
    loss = model(paddle.to_tensor(x)).pow(2).mean()
    if not bool(paddle.isfinite(loss)):
        raise FloatingPointError(f"loss is {float(loss)} at step {step}")
    loss.backward()
    optimizer.step()
    optimizer.clear_grad()
print("script: done", flush=True)
