"""``YOLO("yolov8n.yaml").train(amp=True)`` with ``ampsafe.integrations.ultralytics.add_callbacks(model)``, on four
synthetic 64x64 images on a CPU, two epochs, two optimizer steps each.

Run under ``ampsafe run --emulate-fp16``, so ``amp=True`` trains in float16 with the trainer's own scaler
(ampsafe's). ``--scale`` sets that scaler's scale after the first step (where the next steps overflow float16, say). A recorder
callback (added before the ampsafe one) keeps the scaler's own figures at each epoch end; prints one JSON line
with them and the path of the trainer's ``results.csv``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")
warnings.filterwarnings("ignore")
from ultralytics import YOLO  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "trainers" / "scripts"))
from scaler_figures import scaler_figures  # noqa: E402
from yolo_data import train_args, write_yolo_data  # noqa: E402

from ampsafe.integrations.ultralytics import add_callbacks  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--scale", type=float, default=2.0**16)
args = parser.parse_args()

root = write_yolo_data()

epochs = []


def start_scale(trainer) -> None:
    if trainer.scaler.stats.total_steps == 1:
        trainer.scaler.update(args.scale)  # torch's way to set the scale: the next steps run with it


def record(trainer) -> None:
    figures = scaler_figures(trainer.scaler)
    del figures["total_steps"]
    epochs.append(figures)


model = YOLO("yolov8n.yaml")
model.add_callback("on_train_batch_end", start_scale)
model.add_callback("on_train_epoch_end", record)
add_callbacks(model)
model.train(epochs=2, amp=True, **train_args(root))
print("FIGURES " + json.dumps({"epochs": epochs, "results": str(model.trainer.csv)}), flush=True)
