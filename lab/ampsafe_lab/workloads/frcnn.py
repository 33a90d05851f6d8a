"""``frcnn``: torchvision Faster R-CNN trained from scratch on the synthetic shapes dataset (PyTorch).

The Faster R-CNN seed report is ``loss_* = nan`` early in training; this workload is that model family
(``fasterrcnn_mobilenet_v3_large_320_fpn`` by default, ``fasterrcnn_resnet50_fpn`` with
``backbone="resnet50"``), random weights, no downloads, COCO mAP through :mod:`ampsafe_lab.workloads.coco`.
"""

from __future__ import annotations

from ampsafe._framework import require
from ampsafe.errors import ConfigError, MissingFrameworkError

from .base import Workload
from .coco import held_out_map
from .shapes import MAX_CLASSES, make_samples

__all__ = ["FasterRCNNWorkload", "build", "BACKBONES"]

BACKBONES = {
    "mobilenet": "fasterrcnn_mobilenet_v3_large_320_fpn",
    "resnet50": "fasterrcnn_resnet50_fpn",
}


class FasterRCNNWorkload(Workload):
    """``example_inputs`` = ``(images, targets)`` for ``model(*example_inputs)`` in train mode (a loss dict).

    Labels are shapes classes + 1 (torchvision reserves 0 for background).
    """

    name = "frcnn"
    framework = "torch"

    def __init__(
        self, model, *, seed: int, image_size: int, batch_size: int, num_classes: int, device, max_objects: int = 4
    ):
        self.image_size = image_size
        self.batch_size = batch_size
        self.num_classes = num_classes
        self.device = device
        self.sample_options = {"image_size": image_size, "num_classes": num_classes, "max_objects": max_objects}
        super().__init__(model, (), seed=seed)
        self.example_inputs = self.batch(0)

    def _to_torch(self, samples):
        torch = require("torch")
        images = [
            torch.from_numpy(s.image).permute(2, 0, 1).to(self.device, torch.float32).div_(255.0) for s in samples
        ]
        targets = [
            {
                "boxes": torch.from_numpy(s.boxes).to(self.device),
                "labels": torch.from_numpy(s.labels + 1).to(self.device),
            }
            for s in samples
        ]
        return images, targets

    def batch(self, step: int):
        """``(images, targets)`` of batch ``step``: a list of CHW float tensors in [0, 1] and torchvision targets."""
        return self._to_torch(make_samples(self.seed, step * self.batch_size, self.batch_size, **self.sample_options))

    def loss_dict(self, batch) -> dict:
        images, targets = batch
        return self.model(images, targets)

    def loss(self, batch):
        """Sum of torchvision's four losses (classifier, box_reg, objectness, rpn_box_reg), as its references do."""
        return sum(self.loss_dict(batch).values())

    def make_optimizer(self, lr: float):
        """SGD with momentum 0.9 and weight decay 1e-4, as torchvision's detection references train it."""
        torch = require("torch")
        params = [p for p in self.model.parameters() if p.requires_grad]
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=1e-4)

    def evaluate(self, n_images: int = 16, batch_size: int = 4) -> dict:
        """COCO mAP on ``n_images`` held-out images (eval split), in eval mode; train mode is restored."""

        def predict(samples) -> list[dict]:
            images, _ = self._to_torch(samples)
            return [
                {
                    "boxes": out["boxes"].cpu().numpy(),
                    "scores": out["scores"].cpu().numpy(),
                    "labels": out["labels"].cpu().numpy() - 1,
                }
                for out in self.model(images)
            ]

        return held_out_map(self, predict, n_images=n_images, batch_size=batch_size)


def _torchvision_detection():
    try:
        from torchvision.models import detection
    except ImportError as exc:
        raise MissingFrameworkError(
            "the frcnn workload needs torchvision (pip install torchvision matching your torch build)"
        ) from exc
    return detection


def build(
    *,
    seed: int = 0,
    image_size: int = 320,
    batch_size: int = 2,
    num_classes: int = 3,
    backbone: str = "mobilenet",
    device: str = "cpu",
    max_objects: int = 4,
) -> FasterRCNNWorkload:
    """Faster R-CNN with seeded random weights (``weights=None, weights_backbone=None``), in train mode.

    The model's transform keeps ``image_size`` (``min_size = max_size = image_size``) so the synthetic images
    are not rescaled.
    """
    if backbone not in BACKBONES:
        raise ConfigError(f"unknown frcnn backbone {backbone!r}; choose one of {', '.join(BACKBONES)}")
    if not 1 <= num_classes <= MAX_CLASSES:
        raise ConfigError(f"frcnn num_classes must be in 1..{MAX_CLASSES} (the shapes dataset), got {num_classes}")
    if image_size < 64 or batch_size < 1:
        raise ConfigError(f"frcnn needs image_size >= 64 and batch_size >= 1, got {image_size}, {batch_size}")
    torch = require("torch")
    detection = _torchvision_detection()

    torch.manual_seed(seed)
    factory = getattr(detection, BACKBONES[backbone])
    model = factory(
        weights=None,
        weights_backbone=None,
        num_classes=num_classes + 1,
        min_size=image_size,
        max_size=image_size,
    )
    model.to(device).train()
    return FasterRCNNWorkload(
        model,
        seed=seed,
        image_size=image_size,
        batch_size=batch_size,
        num_classes=num_classes,
        device=device,
        max_objects=max_objects,
    )
