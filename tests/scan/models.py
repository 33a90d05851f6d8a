"""Small torch models for scan tests, each built to show one behaviour."""

from __future__ import annotations

import torch
import torch.nn as nn


class ConvReluConv(nn.Module):
    """conv -> ReLU(inplace) -> conv -> BN; the first conv's path crosses an in-place op."""

    def __init__(self, scale: float = 1.0):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.act = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        with torch.no_grad():
            self.conv1.weight.mul_(scale)

    def forward(self, x):
        return self.bn(self.conv2(self.act(self.conv1(x))))


class Huge(nn.Module):
    """A linear layer whose output leaves float16's range on ordinary inputs."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)
        with torch.no_grad():
            self.fc.weight.fill_(20000.0)
            self.fc.bias.zero_()

    def forward(self, x):
        return torch.sigmoid(self.fc(x))


class SharedTwice(nn.Module):
    """One conv called on two inputs; a dict / list / tuple output."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.head = nn.Linear(4, 2)

    def forward(self, a, b):
        ya, yb = self.conv(a), self.conv(b)
        with torch.no_grad():
            side = self.conv(a).mean()
        return {"maps": [ya, yb], "pair": (self.head(ya.mean((2, 3))), side)}


class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class WithCustomFunction(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(Double.apply(self.conv(x)))


class ExpHead(nn.Module):
    """conv -> BN -> exp: at O2 (everything float16) the exp leaves float16's range; at O1 it runs in float32."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.exp(self.bn(self.conv(x)) * 8.0)


class Raises(nn.Module):
    """Updates BatchNorm statistics and draws random numbers, then fails."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        y = self.drop(self.bn(self.conv(x)))
        raise RuntimeError("boom in forward")
        return y


def tiny_factory():
    """For the CLI: ``ampsafe scan tests.scan.models:tiny_factory`` style specs."""
    torch.manual_seed(0)
    return ConvReluConv(), (torch.randn(1, 3, 16, 16),)


class Attention(nn.Module):
    """MultiheadAttention, LayerNorm, activation checkpointing and a dict output with non-tensor values."""

    def __init__(self):
        super().__init__()
        self.att = nn.MultiheadAttention(16, 2, batch_first=True)
        self.ln = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        y, _ = self.att(x, x, x)
        return {"y": checkpoint(self.fc, self.ln(y), use_reentrant=False), "none": None, "k": 3}
