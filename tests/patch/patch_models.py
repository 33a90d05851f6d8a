"""Small real torch models for the patch tests: a conv path whose activations leave float16 range, a
homogeneous path ending at a BatchNorm (for rescale) and a head with DBNet's logistic step function."""

from __future__ import annotations

import torch
from torch import nn

OVERFLOW_GAIN = 20000.0


class OverflowNet(nn.Module):
    """conv1 (output ~1e5) -> conv2 -> BatchNorm -> relu -> linear: the path conv1 -> conv2 overflows."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = self.bn(self.conv2(self.conv1(x)))
        return self.fc(torch.relu(y).mean((2, 3)))


class HomogeneousNet(nn.Module):
    """Two bias-free conv branches joined by add (one through relu + conv, one through interpolate), then
    BatchNorm: positively homogeneous up to the normalization."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.conv3 = nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        a = self.conv2(torch.relu(self.conv1(x)))
        b = nn.functional.interpolate(self.conv3(x), scale_factor=2.0, mode="nearest")
        y = torch.relu(self.bn(a + b))
        return self.fc(nn.functional.max_pool2d(y, 2).mean((2, 3)))


class StepHead(nn.Module):
    """DBHead's differentiable binarization written as upstream writes it."""

    def __init__(self):
        super().__init__()
        self.k = 50
        self.conv = nn.Conv2d(4, 2, 1)

    def step_function(self, x, y):
        return torch.reciprocal(1 + torch.exp(-self.k * (x - y)))

    def forward(self, x):
        maps = self.conv(x)
        return self.step_function(maps[:, :1], maps[:, 1:])


def build_torch(kind: str, *, seed: int = 0, gain: float = 3 * OVERFLOW_GAIN, gain2: float = 1.0):
    """``kind``: "overflow", "homogeneous" or "step"; ``gain`` multiplies the first convs' weights (the
    default puts conv1's output near 1.5e5), ``gain2`` conv2's."""
    torch.manual_seed(seed)
    overflow, homogeneous, step = OverflowNet, HomogeneousNet, StepHead
    model = {"overflow": overflow, "homogeneous": homogeneous, "step": step}[kind]()
    if kind in ("overflow", "homogeneous"):
        with torch.no_grad():
            model.conv1.weight.mul_(gain)
            model.conv2.weight.mul_(gain2)
            if kind == "homogeneous":
                model.conv3.weight.mul_(gain)
    return model
