"""An ordinary FP32 Paddle training script (no GradScaler, knows nothing about ampsafe); one batch holds a NaN."""

import argparse

import numpy as np
import paddle

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--nan-step", type=int, default=2)
parser.add_argument("--minimize", action="store_true", help="optimizer.minimize(loss) instead of step()")
args = parser.parse_args()

paddle.seed(0)
model = paddle.nn.Sequential(paddle.nn.Linear(16, 32), paddle.nn.ReLU(), paddle.nn.Linear(32, 1))
optimizer = paddle.optimizer.Adam(learning_rate=1e-2, parameters=model.parameters())
for step in range(args.steps):
    x = np.random.RandomState(step).randn(8, 16).astype("float32")
    if step == args.nan_step:
        x[3, 2] = np.nan
    loss = model(paddle.to_tensor(x)).pow(2).mean()
    loss.backward()
    if args.minimize:
        _ops, _params_grads = optimizer.minimize(loss)  # Paddle returns both (its GradScaler unpacks them)
    else:
        optimizer.step()
    optimizer.clear_grad()
finite = all(bool(paddle.isfinite(p).all()) for p in model.parameters())
print(f"script: done, parameters finite: {finite}", flush=True)
