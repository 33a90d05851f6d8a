"""The ``ampsafe demo`` recipe as a plain Paddle AMP script (knows nothing about ampsafe), for ``ampsafe run
--emulate-fp16``: PaddleOCR's DBNet from random init, 128x128 synthetic text, batch 8, Adam lr 1e-2, loss scale
from 1024; within a few steps the unnormalized DBFPN neck drives the head past 65504. ``sys.argv[1]``: the seed,
``sys.argv[2]``: the steps."""

import sys

import paddle

import ampsafe_lab.workloads

seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 12
w = ampsafe_lab.workloads.build("dbnet", seed=seed, image_size=128, batch_size=8)
optimizer = w.make_optimizer(1e-2)
scaler = paddle.amp.GradScaler(init_loss_scaling=1024.0)
for step in range(steps):
    with paddle.amp.auto_cast():
        loss = w.loss(w.batch(step))
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.clear_grad()
