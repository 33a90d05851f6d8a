"""Tiny real models for the bare-scaler tests: a net whose middle Linear (``big``) has no normalization and a
weight scaled so that its output passes 65504 once the inputs grow, inside a wrapper that also holds the loss."""

from __future__ import annotations

GAIN = 1000.0  # big.weight *= GAIN: |big(x)| ~ 1e5-1e6 for inputs of scale 300, ~1e3 for scale 1
HOT = 300.0  # input scale of the overflowing batches


def torch_nets(seed: int = 0):
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.big, self.head = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 1)
            with torch.no_grad():
                self.big.weight.mul_(GAIN)

        def forward(self, x):
            return self.head(torch.relu(self.big(self.fc1(x))))

    class WithLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.net, self.loss = Net(), nn.L1Loss()

        def forward(self, x, y):
            return self.loss(self.net(x).float(), y)

    torch.manual_seed(seed)
    return WithLoss()


def paddle_nets(seed: int = 0):
    import paddle
    from paddle import nn

    class Net(nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc1, self.big, self.head = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 1)
            self.big.weight.set_value(self.big.weight.numpy() * GAIN)

        def forward(self, x):
            return self.head(nn.functional.relu(self.big(self.fc1(x))))

    class WithLoss(nn.Layer):
        def __init__(self):
            super().__init__()
            self.net, self.loss = Net(), nn.L1Loss()

        def forward(self, x, y):
            return self.loss(self.net(x).astype("float32"), y)

    paddle.seed(seed)
    return WithLoss()
