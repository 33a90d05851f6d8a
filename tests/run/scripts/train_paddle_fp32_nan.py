"""An ordinary FP32 Paddle training script (no GradScaler, knows nothing about ampsafe); one batch holds a NaN."""

import argparse

import numpy as np
import paddle

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--nan-step", type=int, default=2)
parser.add_argument("--minimize", action="store_true", help="optimizer.minimize(loss) instead of step()")
parser.add_argument(
    "--raise-on-nan-loss",
    action="store_true",
    help="Tanh (a NaN input reaches the loss; ReLU turns it into 0) and raise on a non-finite loss before backward",
)
args = parser.parse_args()

paddle.seed(0)
act = paddle.nn.Tanh() if args.raise_on_nan_loss else paddle.nn.ReLU()
model = paddle.nn.Sequential(paddle.nn.Linear(16, 32), act, paddle.nn.Linear(32, 1))
optimizer = paddle.optimizer.Adam(learning_rate=1e-2, parameters=model.parameters())
for step in range(args.steps):
    x = np.random.RandomState(step).randn(8, 16).astype("float32")
    if step == args.nan_step:
        x[3, 2] = np.nan
    loss = model(paddle.to_tensor(x)).pow(2).mean()
    if args.raise_on_nan_loss and not bool(paddle.isfinite(loss)):
        raise FloatingPointError(f"loss is {float(loss)} at step {step}")  # no sys.exit: the error ends the script
    loss.backward()
    if args.minimize:
        _ops, _params_grads = optimizer.minimize(loss)  # Paddle returns both (its GradScaler unpacks them)
    else:
        optimizer.step()
    optimizer.clear_grad()
finite = all(bool(paddle.isfinite(p).all()) for p in model.parameters())
print(f"script: done, parameters finite: {finite}", flush=True)
