"""A tiny, ordinary Paddle AMP training script (knows nothing about ampsafe): used by tests/run."""

import argparse

import paddle
import yaml

parser = argparse.ArgumentParser()
parser.add_argument("-c", "--config", default=None)
parser.add_argument("--steps", type=int, default=8)
args = parser.parse_args()
config = {"init_loss_scaling": 1024.0}
if args.config:
    with open(args.config) as fh:
        config.update(yaml.safe_load(fh).get("Global", {}))

paddle.seed(0)
model = paddle.nn.Sequential(paddle.nn.Linear(16, 32), paddle.nn.ReLU(), paddle.nn.Linear(32, 1))
optimizer = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
scaler = paddle.amp.GradScaler(init_loss_scaling=float(config["init_loss_scaling"]))
print(f"script: scaler is {type(scaler).__module__}.{type(scaler).__name__}", flush=True)

for _step in range(args.steps):
    x = paddle.randn([8, 16])
    with paddle.amp.auto_cast():
        loss = model(x).pow(2).mean()
    scaled = scaler.scale(loss)
    scaled.backward()
    scaler.minimize(optimizer, scaled)
    optimizer.clear_grad()
print(f"script: done, scale {scaler.get_loss_scaling()}", flush=True)
