"""A plain Paddle training loop that knows nothing about ampsafe: ``paddle.amp.GradScaler`` and ``auto_cast``.

Under ``ampsafe run --emulate-fp16`` the forward runs in float16 on a CPU. The scaler starts at 2**40, where the
first float16 gradients overflow: the first steps are skipped and backed off, then the loop trains clean.
"""

from __future__ import annotations

import argparse

import paddle

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
args = parser.parse_args()

paddle.seed(0)
model = paddle.nn.Sequential(paddle.nn.Linear(16, 32), paddle.nn.ReLU(), paddle.nn.Linear(32, 1))
optimizer = paddle.optimizer.SGD(learning_rate=1e-3, parameters=model.parameters())
scaler = paddle.amp.GradScaler(init_loss_scaling=2.0**40, decr_ratio=2.0**-8)
for _ in range(args.steps):
    with paddle.amp.auto_cast():
        loss = model(paddle.randn([8, 16])).astype("float32").pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.clear_grad()
print(f"script: {args.steps} steps")
