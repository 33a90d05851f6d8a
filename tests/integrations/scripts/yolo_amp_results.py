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
import tempfile
import warnings
from pathlib import Path

import numpy as np

os.environ.setdefault("YOLO_OFFLINE", "1")
warnings.filterwarnings("ignore")
from PIL import Image  # noqa: E402
from ultralytics import YOLO  # noqa: E402

from ampsafe.integrations.ultralytics import add_callbacks  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--scale", type=float, default=2.0**16)
args = parser.parse_args()

root = Path(tempfile.mkdtemp(prefix="yolo-"))
for split in ("train", "val"):
    (root / "images" / split).mkdir(parents=True)
    (root / "labels" / split).mkdir(parents=True)
    for i in range(4):
        pixels = (np.random.default_rng(i).random((64, 64, 3)) * 255).astype(np.uint8)
        Image.fromarray(pixels).save(root / "images" / split / f"{i}.jpg")
        (root / "labels" / split / f"{i}.txt").write_text("0 0.5 0.5 0.3 0.3\n")
(root / "data.yaml").write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n  0: thing\n")

epochs = []


def start_scale(trainer) -> None:
    if trainer.scaler.stats.total_steps == 1:
        trainer.scaler.update(args.scale)  # torch's way to set the scale: the next steps run with it


def record(trainer) -> None:
    stats = trainer.scaler.stats
    epochs.append(
        {
            "scale": trainer.scaler.get_scale(),
            "overflow_steps": stats.overflow_steps,
            "skipped_steps": stats.skipped_steps,
            "heals": len(stats.heals),
            "floor_hits": stats.floor_hits,
        }
    )


model = YOLO("yolov8n.yaml")
model.add_callback("on_train_batch_end", start_scale)
model.add_callback("on_train_epoch_end", record)
add_callbacks(model)
model.train(
    data=str(root / "data.yaml"),
    epochs=2,
    imgsz=64,
    batch=2,
    nbs=2,  # one optimizer step per batch
    workers=0,
    device="cpu",
    amp=True,
    plots=False,
    val=False,
    project=str(root / "runs"),
    name="r",
    exist_ok=True,
    verbose=False,
    seed=0,
)
print("FIGURES " + json.dumps({"epochs": epochs, "results": str(model.trainer.csv)}), flush=True)
