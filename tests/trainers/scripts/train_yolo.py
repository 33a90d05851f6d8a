"""An ordinary ultralytics script (knows nothing about ampsafe): ``YOLO("yolov8n.yaml").train(...)`` on four
synthetic 64x64 images, on a CPU, saving its checkpoints.

``--amp`` asks for ``amp=True``; ``--nan-step K`` makes the images of step K NaN (a ``preprocess_batch`` wrapper
set from a callback, as user code would); ``--overflow`` multiplies the first conv's weight so that its output
passes float16's 65504; ``--train-images N``: N training images (N / 2 steps an epoch). Prints whether the trained model's parameters and buffers are finite, the trainer's AMP
flag, its scaler class and scale, and the checkpoints written, also after a training that raised.
"""

from __future__ import annotations

import argparse
import os
import warnings

import torch

os.environ.setdefault("YOLO_OFFLINE", "1")
warnings.filterwarnings("ignore")
from ultralytics import YOLO  # noqa: E402
from yolo_data import train_args, write_yolo_data  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--amp", action="store_true")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--nan-step", type=int, default=-1)
parser.add_argument("--overflow", action="store_true")
parser.add_argument("--train-images", type=int, default=4)
args = parser.parse_args()

root = write_yolo_data(args.train_images)

steps = [0]


def setup(trainer) -> None:
    if args.overflow:
        with torch.no_grad():
            trainer.model.model[0].conv.weight.mul_(2e5)  # its output passes 65504 in float16
    original = trainer.preprocess_batch

    def preprocess_batch(batch):
        batch = original(batch)
        if steps[0] == args.nan_step:
            batch["img"] = batch["img"].clone()
            batch["img"][0, 0, 5, 5] = float("nan")
        steps[0] += 1
        return batch

    trainer.preprocess_batch = preprocess_batch


model = YOLO("yolov8n.yaml")
model.add_callback("on_pretrain_routine_end", setup)
try:
    model.train(epochs=args.epochs, amp=args.amp, **train_args(root))
except Exception as error:  # a run that stops still shows the state it left
    print(f"script: training stopped: {type(error).__name__}: {error}", flush=True)
trainer = model.trainer
net = trainer.model
params = all(bool(torch.isfinite(p).all()) for p in net.parameters())
buffers = all(bool(torch.isfinite(b).all()) for b in net.buffers() if b.is_floating_point())
weights = sorted(p.name for p in (root / "runs" / "r" / "weights").glob("*.pt"))
scaler = trainer.scaler
print(
    f"script: done, parameters finite: {params}, buffers finite: {buffers}, amp: {trainer.amp}, scaler: "
    f"{type(scaler).__module__}.{type(scaler).__name__}, scale: {scaler.get_scale() if scaler.is_enabled() else None}"
    f", checkpoints: {','.join(weights)}",
    flush=True,
)
