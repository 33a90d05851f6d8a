"""A Paddle float16 training loop whose GradScaler is static at scale 1 (knows nothing about ampsafe): the scaler
PaddleOCR's ``tools/train.py`` builds from ``Global.use_amp: True`` alone, here in a plain script. The loss is a
weighted term (``--loss-weight``) whose gradients sit near float16's subnormal range at scale 1. Writes its losses
as JSON to ``--out``."""

import argparse
import json

import paddle

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--loss-weight", type=float, default=1e-5)
parser.add_argument("--out", default="losses.json")
args = parser.parse_args()

paddle.seed(0)
nn = paddle.nn
model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 8))
optimizer = paddle.optimizer.Adam(learning_rate=3e-3, parameters=model.parameters())
scaler = paddle.amp.GradScaler(init_loss_scaling=1.0, use_dynamic_loss_scaling=False)
teacher = nn.Linear(32, 8)

losses = []
for _step in range(args.steps):
    x = paddle.randn([128, 32])
    with paddle.no_grad():
        target = teacher(x)
    with paddle.amp.auto_cast():
        out = model(x)
    loss = args.loss_weight * nn.functional.mse_loss(out.astype("float32"), target)
    scaled = scaler.scale(loss)
    scaled.backward()
    scaler.minimize(optimizer, scaled)
    optimizer.clear_grad()
    losses.append(float(loss))

with open(args.out, "w") as fh:
    json.dump({"losses": losses}, fh)
print(f"script: done, loss {losses[0]:.4g} -> {losses[-1]:.4g}", flush=True)
