"""``YOLO("yolov8n.yaml").train(amp=True)`` in a script that knows nothing about ampsafe, on four synthetic 64x64
images on a CPU, two epochs. Under ``ampsafe run --emulate-fp16`` ``amp=True`` trains in float16 with the trainer's
own scaler (ampsafe's). ``--scale``: the scale set after the first step (torch's ``scaler.update(scale)``), where
the next float16 gradients overflow. Prints the path of the trainer's ``results.csv``."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")
warnings.filterwarnings("ignore")
from ultralytics import YOLO  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "trainers" / "scripts"))
from yolo_data import train_args, write_yolo_data  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--scale", type=float, default=2.0**16)
args = parser.parse_args()
batches = []


def start_scale(trainer) -> None:
    batches.append(1)
    if len(batches) == 1:
        trainer.scaler.update(args.scale)


model = YOLO("yolov8n.yaml")
model.add_callback("on_train_batch_end", start_scale)
model.train(epochs=2, amp=True, **train_args(write_yolo_data()))
print(f"RESULTS {model.trainer.csv}", flush=True)
