"""An ordinary Paddle O2 AMP script (knows nothing about ampsafe): plan_models.paddle_net after
``paddle.amp.decorate(level="O2")``, whose ``router`` overflows float16 in the forward pass."""

import argparse
import sys
from pathlib import Path

import paddle

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from plan_models import paddle_batch, paddle_net  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
args = parser.parse_args()

model = paddle_net()
optimizer = paddle.optimizer.SGD(learning_rate=1e-3, parameters=model.parameters())
model, optimizer = paddle.amp.decorate(models=model, optimizers=optimizer, level="O2")
scaler = paddle.amp.GradScaler(init_loss_scaling=2.0**16)
for step in range(args.steps):
    x, y = paddle_batch(step)
    with paddle.amp.auto_cast(level="O2"):
        out = model(x)
    loss = paddle.nn.functional.mse_loss(out.astype("float32"), y)
    scaled = scaler.scale(loss)
    scaled.backward()
    scaler.minimize(optimizer, scaled)
    optimizer.clear_grad()
print(f"script: done, scale {scaler.get_loss_scaling()}, last loss {float(loss):.4f}", flush=True)
