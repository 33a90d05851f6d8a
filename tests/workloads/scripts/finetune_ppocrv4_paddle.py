"""A user's Paddle AMP fine-tune of the shipped PP-OCRv4 det, shaped like PaddleOCR's ``tools/program.py`` (knows
nothing of ampsafe's scalers or patches): the model and pages come from the ``ppocrv4_det`` workload, the
optimizer and lr from ``ch_PP-OCRv4_det_student.yml`` (``FineTuneRecipe.documented()``), ``auto_cast`` (O1)
around the forward and the loss, ``paddle.amp.GradScaler`` from 1024 with dynamic scaling, ``scaler.minimize``."""

import argparse

import paddle

import ampsafe
from ampsafe.workloads.ppocrv4.finetune import FineTuneRecipe

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=7)
parser.add_argument("--after-build", default="", help="Python run once the model is built (`model` in scope)")
args = parser.parse_args()

recipe = FineTuneRecipe.documented()
w = ampsafe.workloads.build("ppocrv4_det", framework="paddle", image_size=recipe.image_size, batch_size=2)
model = w.model
if args.after_build:  # a report's fix line, applied to this model object
    exec(args.after_build)
optimizer = w.make_optimizer(recipe.lr)
scaler = paddle.amp.GradScaler(init_loss_scaling=recipe.init_scale, use_dynamic_loss_scaling=True)
for step in range(args.steps):
    optimizer.set_lr(recipe.lr_at(step))
    batch = w.batch(recipe.page_step(step))
    with paddle.amp.auto_cast(level="O1"):
        loss = w.loss(batch)
    scaled = scaler.scale(loss)
    scaled.backward()
    scaler.minimize(optimizer, scaled)
    optimizer.clear_grad()
    print(f"script: step {step} loss {float(loss):.4f}", flush=True)
print("script: done", flush=True)
