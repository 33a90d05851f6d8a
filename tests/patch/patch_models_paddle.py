"""The Paddle twins of ``patch_models``: same structure, Paddle layers (PaddleOCR-style BatchNorm with act)."""

from __future__ import annotations

import paddle
from paddle import nn

OVERFLOW_GAIN = 20000.0


class OverflowNet(nn.Layer):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2D(3, 8, 3, padding=1, bias_attr=False)
        self.conv2 = nn.Conv2D(8, 8, 3, padding=1, bias_attr=False)
        self.bn = nn.BatchNorm2D(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = self.bn(self.conv2(self.conv1(x)))
        return self.fc(paddle.tanh(y).mean((2, 3)))


class HomogeneousNet(nn.Layer):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2D(3, 8, 3, padding=1, bias_attr=False)
        self.conv2 = nn.Conv2D(8, 8, 3, padding=1, bias_attr=False)
        self.conv3 = nn.Conv2D(3, 8, 3, stride=2, padding=1, bias_attr=False)
        self.bn = nn.BatchNorm(8, act="tanh")  # PaddleOCR's BatchNorm with a fused activation (tanh keeps NaN)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        a = self.conv2(paddle.nn.functional.relu(self.conv1(x)))
        b = paddle.nn.functional.interpolate(self.conv3(x), scale_factor=2.0, mode="nearest")
        y = self.bn(a + b)
        return self.fc(paddle.nn.functional.max_pool2d(y, 2).mean((2, 3)))


class StepHead(nn.Layer):
    def __init__(self):
        super().__init__()
        self.k = 50
        self.conv = nn.Conv2D(4, 2, 1)

    def step_function(self, x, y):
        return paddle.reciprocal(1 + paddle.exp(-self.k * (x - y)))

    def forward(self, x):
        maps = self.conv(x)
        return self.step_function(maps[:, :1], maps[:, 1:])


def build_paddle(kind: str, *, seed: int = 0, gain: float = OVERFLOW_GAIN):
    """``kind``: "overflow", "homogeneous" or "step"; ``gain`` multiplies the first convs' weights."""
    paddle.seed(seed)
    overflow, homogeneous, step = OverflowNet, HomogeneousNet, StepHead
    model = {"overflow": overflow, "homogeneous": homogeneous, "step": step}[kind]()
    if kind in ("overflow", "homogeneous"):
        with paddle.no_grad():
            model.conv1.weight.set_value(model.conv1.weight * gain)
            if kind == "homogeneous":
                model.conv3.weight.set_value(model.conv3.weight * gain)
    return model
