"""Session-scoped scans of the real torchvision models (each frcnn scan costs seconds on 2 CPU cores)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")


def frcnn_model():
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    torch.manual_seed(0)
    return fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, num_classes=5)


def frcnn_batch(n: int = 2, size: int = 320):
    g = torch.Generator().manual_seed(1)
    images = [torch.rand(3, size, size, generator=g) for _ in range(n)]
    targets = [{"boxes": torch.tensor([[10.0, 20.0, 120.0, 150.0]]), "labels": torch.tensor([1])} for _ in range(n)]
    return images, targets


@pytest.fixture(scope="session")
def frcnn():
    return frcnn_model().train()


@pytest.fixture(scope="session")
def frcnn_train_report(frcnn):
    import ampsafe

    images, targets = frcnn_batch()
    return ampsafe.scan(frcnn, (images, targets))


@pytest.fixture(scope="session")
def frcnn_eval_report():
    import ampsafe

    model = frcnn_model().eval()
    images, _ = frcnn_batch()
    return ampsafe.scan(model, (images,))
