"""A user's Paddle AMP fine-tune of the shipped PP-OCRv4 det, shaped like PaddleOCR's ``tools/program.py`` (knows
nothing of ampsafe's scalers or patches): the model and pages come from the ``ppocrv4_det`` workload, the
optimizer and lr from ``ch_PP-OCRv4_det_student.yml`` (``FineTuneRecipe.documented()``), ``auto_cast`` (O1)
around the forward and the loss, ``paddle.amp.GradScaler`` from 1024 with dynamic scaling, ``scaler.minimize``.
``--pages screens --freeze-bn --train-pages 16``: the dark-mode screens fine-tune of bench/real_weights.py."""

import argparse

import paddle

from ampsafe_lab.workloads.ppocrv4.finetune import FineTuneRecipe, freeze_batch_norms

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=7)
parser.add_argument("--after-build", default="", help="Python run once the model is built (`model` in scope)")
parser.add_argument("--pages", default="paper", help="page style: paper, or screens (light text on near-black)")
parser.add_argument("--freeze-bn", action="store_true", help="every BatchNorm in eval mode")
parser.add_argument("--train-pages", type=int, default=8, help="pages in an epoch")
args = parser.parse_args()

recipe = FineTuneRecipe.documented(pages=args.pages, train_pages=args.train_pages)
w = recipe.workload()
model = w.model
if args.freeze_bn:
    freeze_batch_norms(model)
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
