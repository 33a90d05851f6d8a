"""A tiny YOLO dataset (4 random 64x64 images a split unless told, one box each) and the CPU training settings the ultralytics
scripts of the tests share."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from PIL import Image


def write_yolo_data(train_images: int = 4) -> Path:
    """The dataset's folder, holding its ``data.yaml``, in the working folder (the tests run the scripts in a
    temporary one); ``train_images``: how many the train split holds."""
    root = Path(tempfile.mkdtemp(prefix="yolo-", dir=Path.cwd()))
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for i in range(train_images if split == "train" else 4):
            pixels = (np.random.default_rng(i).random((64, 64, 3)) * 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / "images" / split / f"{i}.jpg")
            (root / "labels" / split / f"{i}.txt").write_text("0 0.5 0.5 0.3 0.3\n")
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n  0: thing\n")
    return root


def train_args(root: Path) -> dict:
    """``model.train`` settings for the dataset at ``root``: 64 px, batch 2, one optimizer step per batch, on the
    CPU, no plots or validation, deterministic; the caller adds ``epochs`` and ``amp``."""
    return dict(
        data=str(root / "data.yaml"),
        imgsz=64,
        batch=2,
        nbs=2,
        workers=0,
        device="cpu",
        plots=False,
        val=False,
        project=str(root / "runs"),
        name="r",
        exist_ok=True,
        verbose=False,
        seed=0,
    )
