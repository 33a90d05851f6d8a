"""The tiny LightningModule of ``train_lightning.py``, importable by the tests that apply a report's patch line."""

from __future__ import annotations

import lightning as L
import torch
from torch import nn


class Regressor(L.LightningModule):
    def __init__(self, manual: bool) -> None:
        super().__init__()
        self.automatic_optimization = not manual
        self.net = nn.Sequential()
        self.net.add_module("embed", nn.Linear(16, 64))
        self.net.add_module("norm", nn.BatchNorm1d(64))
        self.net.add_module("head", nn.Linear(64, 1))
        self.dtypes: set = set()

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, _index):
        x, y = batch
        out = self(x)
        self.dtypes.add(str(self.net.embed(x[:1]).dtype).replace("torch.", ""))
        loss = nn.functional.mse_loss(out.float(), y)
        if self.automatic_optimization:
            return loss
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return None

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)
