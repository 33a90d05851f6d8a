"""A detection training loop shaped like torchvision's ``references/detection`` (``train.py`` + ``engine.py``'s
``train_one_epoch``), written for a GPU: ``--amp`` creates ``torch.cuda.amp.GradScaler()``, the forward runs in
``torch.cuda.amp.autocast(enabled=scaler is not None)``, a non-finite reduced loss stops the run with status 1.
Knows nothing about ampsafe. Runs on the CPU; tiny synthetic images and boxes instead of COCO.

``--resume`` loads ``{"model": state_dict}`` as the reference does; ``--head-gain`` multiplies the RoI box head's
weights (``fc6``, ``fc7``) after that, the short way to a head that has grown as high-lr training grows it.
"""

import argparse
import math
import sys
import time

import torch
import torchvision

parser = argparse.ArgumentParser()
parser.add_argument("--amp", action="store_true", help="mixed precision (torch.cuda.amp)")
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--lr", type=float, default=0.02)
parser.add_argument("--image-size", type=int, default=96)
parser.add_argument("--batch-size", type=int, default=2)
parser.add_argument("--head-gain", type=float, default=1.0)
parser.add_argument("--resume", default="")
args = parser.parse_args()

torch.manual_seed(0)
model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
    weights=None,
    weights_backbone=None,
    num_classes=3,
    min_size=args.image_size,
    max_size=args.image_size,
    rpn_batch_size_per_image=64,
    box_batch_size_per_image=64,
)
if args.resume:
    checkpoint = torch.load(args.resume, map_location="cpu", weights_only=True)
    model.load_state_dict(checkpoint["model"])
if args.head_gain != 1.0:
    with torch.no_grad():
        model.roi_heads.box_head.fc6.weight.mul_(args.head_gain)
        model.roi_heads.box_head.fc7.weight.mul_(args.head_gain)
model.train()
params = [p for p in model.parameters() if p.requires_grad]
optimizer = torch.optim.SGD(params, lr=args.lr, momentum=0.9, weight_decay=1e-4)
scaler = torch.cuda.amp.GradScaler() if args.amp else None
print(f"script: scaler {type(scaler).__module__}.{type(scaler).__name__}", flush=True)

generator = torch.Generator().manual_seed(1)


def synthetic_batch(size: int, n: int):
    """``n`` noise images with two boxes each (labels 1..2), as the COCO loader would hand them over."""
    images, targets = [], []
    for _ in range(n):
        images.append(torch.rand(3, size, size, generator=generator))
        corner = torch.rand(2, 2, generator=generator) * size * 0.5
        extent = size * (0.2 + 0.3 * torch.rand(2, 2, generator=generator))
        boxes = torch.cat([corner, (corner + extent).clamp(max=size - 1)], dim=1)
        targets.append({"boxes": boxes, "labels": torch.tensor([1, 2])})
    return images, targets


def reduce_loss_dict(loss_dict):
    """The reference all-reduces the loss dict over the workers; one process here."""
    with torch.no_grad():
        return {k: v.detach() for k, v in loss_dict.items()}


for step in range(args.steps):
    start = time.time()
    images, targets = synthetic_batch(args.image_size, args.batch_size)
    with torch.cuda.amp.autocast(enabled=scaler is not None):
        loss_dict = model(images, targets)
        losses = sum(loss for loss in loss_dict.values())

    loss_dict_reduced = reduce_loss_dict(loss_dict)
    loss_value = sum(loss_dict_reduced.values()).item()
    if not math.isfinite(loss_value):
        print(f"Loss is {loss_value}, stopping training")
        print({k: float(v) for k, v in loss_dict_reduced.items()})
        sys.exit(1)

    optimizer.zero_grad()
    if scaler is not None:
        scaler.scale(losses).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        losses.backward()
        optimizer.step()
    scale = scaler.get_scale() if scaler is not None else None
    print(f"script: step {step} loss {loss_value:.4f} scale {scale} ({time.time() - start:.1f} s)", flush=True)
print("script: done", flush=True)
